"""Checks for the exercises of unit 07 (solutions/07_lora_qlora.ipynb).

Task 1: count LoRA's trainable parameters for Mistral-7B (grouped-query attention: k and v are
1024 wide), all seven linears, as ``count_lora_params(r) -> int``.
Task 2: ``MyQVLoRA.forward``: LoRA on q and v only of GPT-2's fused ``c_attn`` (one
:class:`Conv1D`, d -> 3d, output [q | k | v]), as the LoRA paper adapts W_q and W_v: unchanged at
step 0; once B is trained, q and v get their low-rank updates and k is the base's.
Task 3: ``MyLoRALinear.merge`` (its forward is given) into an ``nn.Linear`` (the lecture's layout)
and into a :class:`Conv1D` (transposed), after which forward skips the adapter.
Task 4: find the bug: ``init_adapter(d_in, d_out, r) -> (A, B)`` must leave the model unchanged
at step 0 (B = 0) and still learn (A random, so B gets a gradient).

The learner's classes are built as ``MyQVLoRA(c_attn, r=..., alpha=...)`` (``base``, ``A_q``
and ``A_v`` (r, d_in), ``B_q`` and ``B_v`` (d, r), ``scaling``) and ``MyLoRALinear(base, r=...,
alpha=...)`` (``base``, ``lora_A`` (r, d_in), ``lora_B`` (d_out, r), ``scaling``, ``merged``);
their ``__init__`` is given in the notebook. Layer sizes, rank, alpha and the ranks of task 1 are drawn from the grading
seed (:func:`course_lib.grading.seeds.case_rng`); alpha is never r, so a missing scaling shows.
Tolerances: the expected values are computed in float64; the learner's fp32 sums, in another order,
differ by rounding that grows with the largest term, so an element may differ by 1e-5 of itself
plus 1e-5 of the tensor's largest magnitude. A missing or doubled scaling (off by 2x or more)
is far outside that.
"""

from __future__ import annotations

import functools

from course_lib.grading.core import fail, passed, run_learner
from course_lib.grading.seeds import case_rng

UNIT = "u07_lora_qlora"

__all__ = [
    "MISTRAL_7B",
    "check_count_lora",
    "check_qv_forward",
    "check_lora_merge",
    "check_init_adapter",
]

#: the model of task 1 (Jiang et al. 2023, arXiv:2310.06825, Table 1)
MISTRAL_7B = {
    "hidden": 4096,
    "n_layer": 32,
    "n_head": 32,
    "n_kv_head": 8,
    "head_dim": 128,
    "ffn_hidden": 14336,
}
_FORBID_COUNT = [
    "course_lib.measure.estimate.lora:lora_params",
    "course_lib.measure.estimate.lora:transformer_lora_params",
    "course_lib.measure.estimate.lora:llama_linear_shapes",
    "course_lib.techniques.lora:add_lora",
    "course_lib.techniques.lora:trainable_params",
]
_FORBID_LAYER = ["course_lib.techniques.lora:LoRALinear", "course_lib.techniques.lora:add_lora"]
RTOL, ATOL = 1e-5, 1e-5  # ATOL: of the expected tensor's largest magnitude
TOLERANCE = f"rtol={RTOL:g}, atol={ATOL:g} of the largest value"


def _mistral_count(r: int) -> int:
    h, f, kv = (
        MISTRAL_7B["hidden"],
        MISTRAL_7B["ffn_hidden"],
        MISTRAL_7B["n_kv_head"] * MISTRAL_7B["head_dim"],
    )
    per_layer = (
        (h + h) + 2 * (h + kv) + (h + h) + 2 * (h + f) + (f + h)
    )  # q, k, v, o, gate, up, down
    return r * per_layer * MISTRAL_7B["n_layer"]


def check_count_lora(count_lora_params, task: int = 1) -> None:
    """Exact counts at r = 1, 16 and two ranks drawn from the grading seed; an int is required."""
    rng = case_rng(task, UNIT)
    for r in (1, rng.randint(2, 12), 16, rng.randint(17, 256)):
        got = run_learner(task, count_lora_params, r, forbid=_FORBID_COUNT)
        if isinstance(got, bool) or not isinstance(got, int):
            fail(
                task,
                f"count_lora_params({r}) returned {type(got).__name__} {got!r}: expected an int",
            )
        if got != _mistral_count(r):
            no_gqa = r * 32 * (4 * (4096 + 4096) + 3 * (4096 + 14336))
            hint = (
                " (k and v map 4096 -> 1024 here: 8 key/value heads of 128)"
                if got == no_gqa
                else ""
            )
            fail(task, f"count_lora_params({r}): {got:,} is not Mistral-7B's count{hint}")
    passed(
        task,
        "Mistral-7B, all seven linears, k and v grouped-query: exact at r = 1, 16 and 2 unseen "
        "ranks",
    )


@functools.cache
def _conv1d_class():
    import torch
    from torch import nn

    class Conv1D(nn.Module):
        """GPT-2's linear layer (Radford et al. 2019; Hugging Face's ``Conv1D``): the weight is
        stored transposed, (d_in, d_out), and the layer computes x @ weight + bias."""

        def __init__(self, in_features: int, out_features: int):
            super().__init__()
            self.in_features, self.out_features = in_features, out_features
            self.weight = nn.Parameter(torch.randn(in_features, out_features) * 0.02)
            self.bias = nn.Parameter(torch.zeros(out_features))

        def forward(self, x):
            return x @ self.weight + self.bias

    return Conv1D


def __getattr__(name: str):
    """``Conv1D``, the base of tasks 2 and 3, built on first use (this module imports no torch
    at import time)."""
    if name == "Conv1D":
        return _conv1d_class()
    raise AttributeError(name)


def _layer(MyLoRALinear, task: int, kind: str = "linear"):
    """The learner's layer around a base with sizes, rank and alpha drawn from the grading seed,
    and a copy of the base as it was."""
    import copy

    import torch
    from torch import nn

    rng = case_rng(task, UNIT)
    d_in, d_out = rng.randint(12, 40), rng.randint(6, 30)
    d_out += d_out == d_in  # never square: the two layouts must differ
    r = rng.choice((2, 4, 8))
    alpha = rng.choice([a for a in (1, 4, 8, 16, 32) if a != r])  # scaling != 1
    torch.manual_seed(rng.getrandbits(31))
    base = nn.Linear(d_in, d_out) if kind == "linear" else _conv1d_class()(d_in, d_out)
    with torch.no_grad():
        base.bias.normal_()
    ref = copy.deepcopy(base)
    shapes = {"lora_A": (r, d_in), "lora_B": (d_out, r)}
    layer = _build(task, MyLoRALinear, base, r=r, alpha=alpha, shapes=shapes)
    return layer, ref, alpha / r, rng


def _build(task: int, cls, base, *, r: int, alpha: int, shapes: dict[str, tuple[int, int]]):
    """The learner's ``cls(base, r=r, alpha=alpha)``, its adapter tensors checked by shape."""
    import torch

    layer = run_learner(task, cls, base, r=r, alpha=alpha, forbid=_FORBID_LAYER)
    made = (
        f"{getattr(cls, '__name__', 'the class')}({type(base).__name__}({base.in_features}, "
        f"{base.out_features}), r={r}, alpha={alpha})"
    )
    for name, shape in shapes.items():
        t = getattr(layer, name, None)
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != shape:
            fail(
                task,
                f"{made}.{name}: expected a tensor of shape {shape}, got "
                f"{getattr(t, 'shape', t)!r}",
            )
    return layer


def _near(got, expected) -> bool:
    """``got`` within RTOL of each expected element plus ATOL of the largest one (float64)."""
    g, e = got.detach().double(), expected.detach().double()
    scale = max(float(e.abs().max()), 1.0) if e.numel() else 1.0
    return bool(((g - e).abs() <= ATOL * scale + RTOL * e.abs()).all())


def _close(task: int, what: str, got, expected) -> None:
    import torch

    if not isinstance(got, torch.Tensor) or got.shape != expected.shape:
        fail(
            task,
            f"{what}: expected a tensor of shape {tuple(expected.shape)}, got {getattr(got, 'shape', got)!r}",
        )
    if not _near(got, expected):
        err = float((got.detach().double() - expected.detach().double()).abs().max())
        fail(task, f"{what}: max abs error {err:.3g} ({TOLERANCE})")


def _qv_layer(MyQVLoRA, task: int):
    """The learner's q/v adapter around a GPT-2 ``c_attn`` (Conv1D d -> 3d) with d, r and alpha
    drawn from the grading seed; a copy of the base as it was; d; the scaling; the rng."""
    import copy

    import torch

    rng = case_rng(task, UNIT)
    d = rng.randint(8, 24)
    r = rng.choice((2, 4, 8))
    alpha = rng.choice([a for a in (1, 4, 8, 16, 32) if a != r])  # scaling != 1
    torch.manual_seed(rng.getrandbits(31))
    base = _conv1d_class()(d, 3 * d)
    with torch.no_grad():
        base.bias.normal_()
    ref = copy.deepcopy(base)
    shapes = {"A_q": (r, d), "B_q": (d, r), "A_v": (r, d), "B_v": (d, r)}
    layer = _build(task, MyQVLoRA, base, r=r, alpha=alpha, shapes=shapes)
    return layer, ref, d, alpha / r, rng


def check_qv_forward(MyQVLoRA, task: int = 2) -> None:
    """On GPT-2's fused c_attn (Conv1D d -> 3d, [q | k | v]): forward = base(x) at step 0; once
    B_q and B_v are trained, the output of the base whose weight carries (alpha / r) B A in its
    q and v columns (k's untouched), for 3-D and 2-D inputs; only the adapter gets gradients."""
    import torch

    layer, ref, d, scaling, rng = _qv_layer(MyQVLoRA, task)
    g = torch.Generator().manual_seed(rng.getrandbits(63))
    x = torch.randn(rng.randint(2, 4), rng.randint(3, 6), d, generator=g)
    with torch.no_grad():
        _close(
            task,
            "output at step 0 (B = 0) vs the base layer",
            run_learner(task, layer, x, forbid=_FORBID_LAYER),
            ref(x),
        )
        for name in ("B_q", "B_v"):
            getattr(layer, name).copy_(torch.randn((d, layer.A_q.shape[0]), generator=g))
        w = ref.weight.detach().double()  # (d, 3d): Conv1D's layout, columns [q | k | v]
        for name, cols in (("q", slice(0, d)), ("v", slice(2 * d, 3 * d))):
            a, b = (getattr(layer, f"{m}_{name}").detach().double() for m in "AB")
            w[:, cols] += scaling * (b @ a).T
    for inp in (x, x[0]):
        expected = inp.double() @ w + ref.bias.detach().double()  # float64: the exact output
        got = run_learner(task, layer, inp, forbid=_FORBID_LAYER)
        what = f"c_attn = Conv1D({d}, {3 * d}), input shape {tuple(inp.shape)}, B != 0"
        if isinstance(got, torch.Tensor) and got.shape == expected.shape:
            base_out = inp.double() @ ref.weight.detach().double() + ref.bias.detach().double()
            _check_qkv_parts(task, what, got, expected, base_out, d, scaling)
        _close(task, what, got, expected)
    _check_adapter_gradients(task, layer, got)
    passed(
        task,
        f"LoRA on q and v of GPT-2's fused c_attn: unchanged at step 0, q and v updated by "
        f"(alpha / r) B A x once B is trained, k the base's, base frozen ({TOLERANCE})",
    )


def _check_qkv_parts(task: int, what: str, got, expected, base_out, d: int, scaling: float):
    """Name the part of the fused output that is wrong: k changed, or q or v not updated."""

    k = slice(d, 2 * d)
    if not _near(got[..., k], base_out[..., k]):
        fail(
            task,
            f"{what}: the k part of the output (columns {d}..{2 * d - 1}) differs from the "
            "base's: this adapter changes q and v only",
        )
    for part, first in (("q", 0), ("v", 2 * d)):
        cols = slice(first, first + d)
        if not _near(got[..., cols], expected[..., cols]):
            fail(
                task,
                f"{what}: the {part} part of the output (columns {first}..{first + d - 1}) is "
                f"not the base's plus (alpha / r = {scaling:g}) x A_{part}^T B_{part}^T",
            )


def _check_adapter_gradients(task: int, layer, out) -> None:
    """The base stays frozen and each of the four adapter tensors gets a gradient from ``out``."""
    if out.requires_grad:
        out.sum().backward()
    if layer.base.weight.grad is not None or layer.base.bias.grad is not None:
        fail(task, "the base got a gradient: it must stay frozen")
    missing = [n for n in ("A_q", "B_q", "A_v", "B_v") if getattr(layer, n).grad is None]
    if missing:
        fail(
            task,
            f"{', '.join(missing)} got no gradient: compute the output from the adapter's "
            "tensors with torch operations",
        )


def check_lora_merge(MyLoRALinear, task: int = 3) -> None:
    """After merge, into an nn.Linear and into a Conv1D: base.weight is W0 plus the update in the
    base's own layout, and forward gives the same output as before (not added twice)."""
    for kind in ("linear", "conv1d"):
        _check_merge_into(MyLoRALinear, task, kind)
    passed(
        task,
        f"merge() folds (alpha / r) B A into W0 of an nn.Linear and of a GPT-2 Conv1D (stored "
        f"transposed) and the output is unchanged ({TOLERANCE})",
    )


def _check_merge_into(MyLoRALinear, task: int, kind: str) -> None:
    import torch

    layer, ref, scaling, rng = _layer(MyLoRALinear, task, kind)
    name = type(ref).__name__
    g = torch.Generator().manual_seed(rng.getrandbits(63))
    x = torch.randn(rng.randint(3, 8), ref.in_features, generator=g)
    with torch.no_grad():
        layer.lora_B.copy_(torch.randn(layer.lora_B.shape, generator=g))
        before = run_learner(task, layer, x, forbid=_FORBID_LAYER)
        run_learner(task, layer.merge, forbid=_FORBID_LAYER)
        b, a = layer.lora_B.double(), layer.lora_A.double()
        delta = scaling * b @ a  # (d_out, d_in): nn.Linear's layout; float64, the exact sum
        expected_w = ref.weight.double() + (delta if kind == "linear" else delta.T)
        _close(
            task,
            f"{name} base: base.weight after merge() vs W0 plus (alpha / r) B A in its layout",
            layer.base.weight.detach(),
            expected_w,
        )
        after = run_learner(task, layer, x, forbid=_FORBID_LAYER)
        if _near(after, before + (before - ref(x))):
            fail(
                task,
                f"{name} base: after merge() the update is added twice: forward must skip the "
                "adapter once merged",
            )
        _close(task, f"{name} base: output after merge() vs before", after, before)


def check_init_adapter(init_adapter, task: int = 4) -> None:
    """The fixed init: shapes (r, d_in) and (d_out, r); a layer adapted with it computes exactly
    what the base computes (B = 0); one SGD step changes the output (A is not zero)."""
    import torch

    rng = case_rng(task, UNIT)
    torch.manual_seed(rng.getrandbits(31))
    d_in, d_out, r = rng.randint(16, 48), rng.randint(8, 32), rng.choice((2, 4, 8))
    got = run_learner(task, init_adapter, d_in, d_out, r, forbid=_FORBID_LAYER)
    if not (
        isinstance(got, tuple) and len(got) == 2 and all(isinstance(t, torch.Tensor) for t in got)
    ):
        fail(
            task,
            f"init_adapter must return a tuple (A, B) of two tensors, got {type(got).__name__}",
        )
    A, B = (t.detach().clone().float().requires_grad_(True) for t in got)
    if tuple(A.shape) != (r, d_in) or tuple(B.shape) != (d_out, r):
        fail(
            task,
            f"shapes: expected A {(r, d_in)} and B {(d_out, r)}, got {tuple(A.shape)} and {tuple(B.shape)}",
        )
    g = torch.Generator().manual_seed(rng.getrandbits(63))
    W = torch.randn(d_out, d_in, generator=g)
    x = torch.randn(8, d_in, generator=g)
    y = x @ (W + 2.0 * B @ A).T
    change = float((y - x @ W.T).detach().abs().max())
    if change != 0.0:
        fail(
            task,
            f"the adapted layer changes the pre-trained output at step 0 by up to {change:.3g}: "
            "B A must be exactly zero at initialisation",
        )
    y.pow(2).mean().backward()
    with torch.no_grad():
        A -= 0.1 * A.grad
        B -= 0.1 * B.grad
        moved = float((x @ (W + 2.0 * B @ A).T - x @ W.T).abs().max())
    if moved == 0.0:
        fail(
            task,
            "after one SGD step the adapter still changes nothing: with A and B both zero no "
            "gradient reaches either (dL/dB = g (A x)^T, dL/dA = B^T g x^T); keep A random",
        )
    passed(task, "B A = 0 at step 0 (the model is unchanged) and one SGD step moves the output")
