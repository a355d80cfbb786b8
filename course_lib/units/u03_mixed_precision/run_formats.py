"""Unit 03, the formats: what fp32, bf16, fp16 (and fp8) keep of a value, and which gradients of a
real backward fp16 would flush to zero.

Used by notebooks/03_mixed_precision.ipynb through :mod:`run` (which re-exports these names).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import pandas as pd
import torch

from course_lib import kit
from course_lib.data import permutation_batch
from course_lib.models import GPT, GPTConfig
from course_lib.techniques import precision as P


@dataclass(frozen=True)
class RoundingRow:
    """One value stored in one format (:func:`rounding_table`)."""

    value: float
    format: str
    stored: float
    bits: str
    rel_error: float
    underflow: bool
    overflow: bool


@dataclass(frozen=True)
class UnderflowRow:
    """The share of gradients stored as 0, subnormal or inf in one format at one scale."""

    format: str
    scale: float
    zero: float
    subnormal: float
    inf: float


def _formats(formats: Sequence[str]) -> list[str]:
    if isinstance(formats, str):
        formats = [formats]
    for f in formats:
        P.bit_layout(f)  # validates, names the valid choices
    return list(formats)


# --------------------------------------------------------------------------------------------
# formats
# --------------------------------------------------------------------------------------------
def format_table(formats: Sequence[str] = tuple(P.FORMATS)) -> pd.DataFrame:
    """One row per format: bits, exponent/mantissa split, range and precision (from torch.finfo)."""
    rows = [P.bit_layout(f) for f in _formats(formats)]
    return kit.frame(rows, P.BitLayout).drop(columns=["dtype"]).set_index("name")


def rounding_table(
    values: Sequence[float], formats: Sequence[str] = ("fp32", "bf16", "fp16")
) -> pd.DataFrame:
    """Each value stored in each format: the stored value, its bits, the relative error, and
    whether it underflowed to 0 or overflowed to inf."""
    rows = []
    for v in values:
        for f in _formats(formats):
            stored = P.round_trip(float(v), f)
            rows.append(
                RoundingRow(
                    float(v),
                    f,
                    stored,
                    P.bit_string(v, f),
                    abs(stored - v) / abs(v) if v != 0 and math.isfinite(stored) else float("nan"),
                    v != 0 and stored == 0.0,
                    math.isinf(stored) and math.isfinite(v),
                )
            )
    return kit.frame(rows, RoundingRow)


# --------------------------------------------------------------------------------------------
# gradients: what fp16 would flush to zero
# --------------------------------------------------------------------------------------------
def gradient_histogram(
    *, config: GPTConfig | None = None, batch: int = 8, seq: int = 64, seed: int = 0
) -> torch.Tensor:
    """All activation gradients (the ``grad_output`` of every Linear) of one fp32 backward of
    the tiny GPT, as one flat fp32 tensor of their absolute values (zeros removed)."""
    config = config or GPTConfig.tiny()
    torch.manual_seed(seed)
    model = GPT(config)
    gen = torch.Generator().manual_seed(seed)
    idx, tgt = permutation_batch(config, batch, seq, generator=gen)
    grads: list[torch.Tensor] = []

    def keep(
        mod: torch.nn.Module, gin: object, gout: tuple[torch.Tensor, ...] | torch.Tensor
    ) -> None:
        grads.append(gout[0].detach().abs().flatten())

    hooks = [
        m.register_full_backward_hook(keep)
        for m in model.modules()
        if isinstance(m, torch.nn.Linear)
    ]
    try:
        model.loss(idx, tgt).backward()
    finally:
        for h in hooks:
            h.remove()
    g = torch.cat(grads)
    return g[g > 0]


def underflow_fractions(
    abs_grads: torch.Tensor,
    scales: Sequence[float] = (1.0, 2.0**8, 2.0**16),
    formats: Sequence[str] = ("fp16", "bf16"),
) -> pd.DataFrame:
    """Share of the gradient values that become 0 (underflow) or land below the smallest normal
    (subnormal: fewer mantissa bits) when ``value * scale`` is stored in each format, and the
    share that overflows to inf."""
    if not isinstance(abs_grads, torch.Tensor) or abs_grads.numel() == 0:
        raise ValueError("abs_grads must be a non-empty tensor of gradient magnitudes")
    rows = []
    for f in _formats(formats):
        lay = P.bit_layout(f)
        for s in scales:
            if not s > 0:
                raise ValueError(f"scales must be positive, got {s!r}")
            stored = (abs_grads.double() * s).to(lay.dtype)
            subnormal = (stored > 0) & (stored < lay.smallest_normal)
            rows.append(
                UnderflowRow(
                    f,
                    float(s),
                    float((stored == 0).double().mean()),
                    float(subnormal.double().mean()),
                    float(torch.isinf(stored).double().mean()),
                )
            )
    return kit.frame(rows, UnderflowRow)
