"""Unit 10 at scale, through estimate: the stage that fits, and the sources' numbers.

Used by notebooks/10_zero_fsdp.ipynb through :mod:`run` (which re-exports these names).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

from course_lib import kit, validate
from course_lib.measure import estimate


# --------------------------------------------------------------------------------------------
# at scale, through estimate
# --------------------------------------------------------------------------------------------
def scale_grid(
    n_params: float = 7e9, world_sizes: Sequence[int] = (1, 2, 4, 8, 16), *, k: int = 12
) -> pd.DataFrame:
    """GB (1e9 B) of model state per GPU, stage (rows) x data-parallel ranks (columns), 16 B per
    parameter by default (bf16 params and grads, fp32 master + Adam moments; k = 12)."""
    n = validate.count("n_params", n_params, minimum=1)
    sizes = validate.counts("world_sizes", world_sizes, minimum=1)
    return pd.DataFrame(
        {
            f"N={w}": [
                estimate.zero_bytes_per_rank(n, stage=s, world_size=w, k=k) / 1e9
                for s in (0, 1, 2, 3)
            ]
            for w in sizes
        },
        index=[f"stage {s}" for s in (0, 1, 2, 3)],
    )


def smallest_stage(n_params: float, world_size: int, gpu_GB: float, *, k: int = 12) -> int | None:
    """The lowest ZeRO stage whose model state (16 B/param by default) fits in ``gpu_GB`` GB per
    GPU, or None if even stage 3 does not (activations not counted)."""
    n = validate.count("n_params", n_params, minimum=1)
    w = validate.count("world_size", world_size, minimum=1)
    cap = validate.number("gpu_GB", gpu_GB, positive=True)
    for stage in (0, 1, 2, 3):
        if estimate.zero_bytes_per_rank(n, stage=stage, world_size=w, k=k) <= cap * 1e9:
            return stage
    return None


def _gb(n_bytes: float) -> float:
    return round(n_bytes / 1e9, 3)


def _stages_gb(n_params: int, world_size: int, *, k: int = 12) -> str:
    """Bytes per rank of stages 0-3 in GB, "a / b / c / d"."""
    return " / ".join(
        f"{_gb(estimate.zero_bytes_per_rank(n_params, stage=s, world_size=world_size, k=k)):g}"
        for s in range(4)
    )


@dataclass(frozen=True)
class SourceRow:
    """One of the sources' claims (:func:`source_checks`), quoted and recomputed."""

    source: str
    claim: str
    quoted: str
    recomputed: str


def source_checks() -> pd.DataFrame:
    """The sources' ZeRO figures, recomputed with estimate (GB = 1e9 B). One row per claim:
    source, claim, quoted, recomputed."""
    z = estimate.zero_bytes_per_rank
    b7, b12 = 7_000_000_000, 12_000_000_000
    traffic = estimate.zero_bytes_sent_per_step(
        10**9, 8, stage=3
    ) / estimate.ring_allreduce_bytes_sent(10**9, 8)
    rows = [
        ("S0 / ZeRO Fig. 1", "7.5B on 64 GPUs, stages 0-3 (GB)", "120 / 31.4 / 16.6 / 1.9",
         _stages_gb(7_500_000_000, 64)),
        ("S1", "10B on 8 GPUs (GB)", "160 / 55 / 37.5 / 20", _stages_gb(10_000_000_000, 8)),
        ("S4", "7B on 8 GPUs (GB)", "112 / 38.5 / 26.25 / 14", _stages_gb(b7, 8)),
        ("S1 exercise 3", "12B: DP vs ZeRO-3 on 8 (GB)", "192 / 24",
         f"{_gb(z(b12, stage=0, world_size=8)):g} / {_gb(z(b12, stage=3, world_size=8)):g}"),
        ("S3", "ZeRO-1 = 2Ψ + 14Ψ/N; 7B, N = 8 (GB)", f"{_gb(2 * b7 + 14 * b7 / 8):g}",
         f"4Ψ + 12Ψ/N = {_gb(z(b7, stage=1, world_size=8)):g}"),
        ("S2", "table 95 / 52 / 38 / 16 GB (7B, 8 GPUs)", "95 / 52 / 38 / 16",
         f"16 B: {_stages_gb(b7, 8)}; 12 B: {_stages_gb(b7, 8, k=8)}"),
        ("S2", "stage 1 saves ~60 % of optimizer state (N = 8)", "60 %", f"{100 * (1 - 1 / 8):g} %"),
        ("S4", "ZeRO-3 traffic vs DDP (one micro-batch per step)", "3x", f"{traffic:g}x"),
    ]  # fmt: skip
    return kit.frame([SourceRow(*row) for row in rows], SourceRow)
