"""Unit 17, the numbers: FP8 formats, outliers against each scaling, each recipe's error, the
scaled-matmul kernel against its emulation, and delayed scaling after a spike.

Used by notebooks/17_fp8_training.ipynb through :mod:`run` (which re-exports these names).
Every error here is measured on the CPU: ``torch._scaled_mm`` runs there in torch 2.13 for
tensorwise and rowwise scales; blockwise products are emulated (dequantise, multiply in fp32).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import pandas as pd
import torch
from torch import nn

from course_lib import kit, validate
from course_lib.measure import estimate
from course_lib.techniques.fp8 import (
    fp8_matmul,
    relative_error,
    to_float8,
)
from course_lib.techniques.fp8_linear import RECIPES, Float8Linear
from course_lib.units.u17_fp8_training._setup import BLOCK, batch_fn, model_fn

#: the layer whose input the numerics sections cast: block 0's MLP input projection
LAYER = "blocks.0.mlp.c_fc"


@dataclass(frozen=True)
class FormatRow:
    """:func:`formats_table`: one format as torch has it beside the paper (NaN: no paper row)."""

    format: str
    max: float
    max_paper: float = field(metadata=kit.column("max (paper)"))
    min_normal: float = field(metadata=kit.column("min normal"))
    min_normal_paper: float = field(metadata=kit.column("min normal (paper)"))
    min_subnormal: float = field(metadata=kit.column("min subnormal"))
    min_subnormal_paper: float = field(metadata=kit.column("min subnormal (paper)"))
    epsilon: float


@dataclass(frozen=True)
class OutlierRow:
    """:func:`outlier_table`: one cast of the activations with one channel grown."""

    outlier_x: float = field(metadata=kit.column("outlier x"))
    amax_over_median: float = field(metadata=kit.column("amax / median"))
    cast: str
    error_other: float = field(metadata=kit.column("error, other channels"))
    flushed: float = field(metadata=kit.column("flushed to 0"))
    output_error: float = field(metadata=kit.column("output error"))


@dataclass(frozen=True)
class RecipeErrorRow:
    """:func:`recipe_errors`: one recipe's errors against fp32 at one outlier factor."""

    outlier_x: float = field(metadata=kit.column("outlier x"))
    recipe: str
    output: float
    input_grad: float = field(metadata=kit.column("input grad"))
    weight_grad: float = field(metadata=kit.column("weight grad"))
    gemm: str


@dataclass(frozen=True)
class ScaledMMRow:
    """:func:`scaled_mm_parity`: the kernel against its emulation for one scaling."""

    scaling: str
    kernel: str
    max_abs_diff: float = field(metadata=kit.column("max abs diff"))
    bitwise_equal: bool = field(metadata=kit.column("bitwise equal"))


def formats_table() -> pd.DataFrame:
    """E4M3, E5M2 and bf16 as torch implements them (``torch.finfo``; the smallest subnormal read
    from the bit pattern 0x01) beside Micikevicius et al.'s Table 1 (``estimate.fp8_format``)."""
    rows = []
    for name, dtype in (("e4m3", torch.float8_e4m3fn), ("e5m2", torch.float8_e5m2)):
        fi, paper = torch.finfo(dtype), estimate.fp8_format(name)
        tiny = float(torch.tensor([1], dtype=torch.uint8).view(dtype).float())
        rows.append(
            FormatRow(
                f"{name} (torch.{dtype})".replace("torch.torch.", "torch."),
                float(fi.max), paper.max_normal, float(fi.smallest_normal), paper.min_normal,
                tiny, paper.min_subnormal, float(fi.eps),
            )
        )  # fmt: skip
    fi = torch.finfo(torch.bfloat16)
    tiny = float(torch.tensor([1], dtype=torch.int16).view(torch.bfloat16).float())
    nan = math.nan
    rows.append(
        FormatRow("bf16 (torch.bfloat16)", float(fi.max), nan, float(fi.smallest_normal), nan,
                  tiny, nan, float(fi.eps))
    )  # fmt: skip
    return kit.frame(rows, FormatRow)


@functools.lru_cache(maxsize=2)
def _trained_state(steps: int, seed: int) -> dict[str, torch.Tensor]:
    model = model_fn(seed)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(seed + 1)
    with kit.one_thread():
        for _ in range(steps):
            loss = model.loss(*batch_fn(gen))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    return {k: v.clone() for k, v in model.state_dict().items()}


def trained_model(*, steps: int = 40, seed: int = 0) -> nn.Module:
    """The unit's GPT after ``steps`` fp32 Adam steps on the permutation task (cached)."""
    model = model_fn(seed)
    model.load_state_dict(_trained_state(validate.count("steps", steps, minimum=0), seed))
    return model


def captured_activations(*, layer: str = LAYER, seed: int = 0) -> tuple[torch.Tensor, nn.Linear]:
    """The input ``layer`` really receives in the trained GPT on one batch, as (tokens, width),
    and the layer itself (fp32)."""
    model = trained_model(seed=seed)
    lin = model.get_submodule(layer)
    assert isinstance(lin, nn.Linear), layer
    seen: list[torch.Tensor] = []
    handle = lin.register_forward_hook(lambda m, args, out: seen.append(args[0].detach()))
    with torch.no_grad():
        model(batch_fn(torch.Generator().manual_seed(seed + 99))[0])
    handle.remove()
    return seen[0].reshape(-1, lin.in_features), lin  # (128, 128): tokens, width


def _with_outlier(x: torch.Tensor, factor: float, channel: int) -> torch.Tensor:
    x = x.clone()
    x[:, channel] *= factor  # one channel (a column: every token has it) grows
    return x


def _casts(x: torch.Tensor, block: int) -> dict[str, torch.Tensor]:
    out = {s: to_float8(x, scaling=s, block=block).dequantize() for s in ("tensorwise", "rowwise")}
    out[f"blockwise 1x{block}"] = to_float8(x, scaling="blockwise", block=block).dequantize()
    out["bf16 (no scale)"] = x.bfloat16().float()
    return out


def outlier_table(
    factors: Sequence[float] = (1, 100, 1e4, 1e5, 1e6), *, channel: int = 3, block: int = BLOCK
) -> pd.DataFrame:
    """Cast the captured activations with channel ``channel`` multiplied by each factor. Per
    factor and cast: ``amax / median |x|`` of the tensor, the relative error of the *other*
    channels, the share of their non-zero values flushed to 0, and the relative error of the
    layer's output (x W^T, W cast the same way; bf16 casts both to bf16)."""
    x0, lin = captured_activations()
    w = lin.weight.detach()
    ch = validate.count("channel", channel, maximum=x0.shape[1] - 1)
    keep = torch.ones(x0.shape[1], dtype=torch.bool)
    keep[ch] = False
    rows = []
    for f in factors:
        x = _with_outlier(x0, validate.number("factors[i]", f, positive=True), ch)
        wq = _casts(w, block)
        wq[f"blockwise 1x{block}"] = to_float8(
            w, scaling="blockwise", block=(block, block)
        ).dequantize()
        ref = x @ w.T
        for name, xq in _casts(x, block).items():
            normal = x[:, keep]
            rows.append(
                OutlierRow(
                    f, float(x.abs().max() / x.abs().median()), name,
                    relative_error(xq[:, keep], normal),
                    float(((xq[:, keep] == 0) & (normal != 0)).float().mean()),
                    relative_error(xq @ wq[name].T, ref),
                )
            )  # fmt: skip
    return kit.frame(rows, OutlierRow)


def _grads(
    layer: nn.Module, x: torch.Tensor, dy: torch.Tensor, bf16: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    x = x.clone().requires_grad_(True)
    for p in layer.parameters():
        p.grad = None
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        y = layer(x)
    y.float().backward(dy)
    w = layer.weight
    assert isinstance(w, torch.Tensor) and x.grad is not None and w.grad is not None
    return y.detach().float(), x.grad.float(), w.grad.float()


def recipe_errors(
    recipes: Sequence[str] = tuple(RECIPES),
    *,
    outliers: Sequence[float] = (1, 1_000),
    block: int = BLOCK,
) -> pd.DataFrame:
    """Each recipe's ``Float8Linear`` on the captured activations (channel 3 multiplied by each
    of ``outliers``) against fp32: relative error of the output, of the input gradient and of the
    weight gradient (the upstream gradient: normal, 1e-3), and how its GEMMs ran. A bf16
    autocast row for scale."""
    x0, lin = captured_activations()
    dy = (
        torch.randn(x0.shape[0], lin.out_features, generator=torch.Generator().manual_seed(5))
        * 1e-3
    )
    rows = []
    for factor in outliers:
        x = _with_outlier(x0, factor, 3)
        ref = _grads(lin, x, dy)
        runs: list[tuple[str, nn.Module, bool]] = [("bf16 autocast", lin, True)]
        runs += [(r, Float8Linear.from_linear(lin, recipe=r, block=block), False) for r in recipes]
        for name, layer, bf16 in runs:
            got = _grads(layer, x, dy, bf16)
            y, gx, gw = (relative_error(g, r) for g, r in zip(got, ref))
            rows.append(
                RecipeErrorRow(factor, name, y, gx, gw, getattr(layer, "gemm", "bf16 matmul"))
            )
    return kit.frame(rows, RecipeErrorRow)


def scaled_mm_parity(*, m: int = 64, k: int = 128, n: int = 96, seed: int = 0) -> pd.DataFrame:
    """``torch._scaled_mm`` (fp32 out) against an fp32 matmul of the dequantised operands, for
    tensorwise and rowwise scales: max |difference| and whether the two are bitwise equal. A
    scaling whose kernel does not run on this machine's CPU has no row. The kernel runs here
    even where it is too slow for the training runs (``scaled_mm_available`` says False there:
    on some AVX-512 CPUs the tensorwise one takes a slow path), because parity asks what it
    computes, not how fast."""
    gen = torch.Generator().manual_seed(seed)
    a, b = torch.randn(m, k, generator=gen), torch.randn(n, k, generator=gen)
    rows = []
    for scaling in ("tensorwise", "rowwise"):
        qa, qb = to_float8(a, scaling=scaling), to_float8(b, scaling=scaling)
        n_scales = m if scaling == "rowwise" else 1
        sa, sb = qa.scale.reshape(n_scales, 1), qb.scale.reshape(1, -1)
        if scaling == "tensorwise":
            sa, sb = sa.reshape(()), sb.reshape(())
        try:
            kernel = torch._scaled_mm(
                qa.data, qb.data.t(), scale_a=sa, scale_b=sb, out_dtype=torch.float32
            )
        except (RuntimeError, NotImplementedError):
            continue  # no kernel for this scaling on this CPU (torch 2.11: tensorwise only)
        emulated, _ = fp8_matmul(qa, qb, emulate=True)
        diff = float((kernel - emulated).abs().max())
        rows.append(ScaledMMRow(scaling, "_scaled_mm", diff, bool(torch.equal(kernel, emulated))))
    return kit.frame(rows, ScaledMMRow)
