"""Unit 10, "When the gathers hide": ZeRO-3 / FSDP's all-gather of the next layer beside the
current layer's compute, measured on 2 gloo ranks with a stand-in device
(``measure.hiding.speed_sweep``), beside ``estimate.fsdp_overlap_min_tokens``.
Used by notebooks/10_zero_fsdp.ipynb through :mod:`run`.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from course_lib import validate
from course_lib.measure import estimate

__all__ = ["THRESHOLD_TOKENS", "fsdp_threshold"]

#: tokens per rank swept by :func:`fsdp_threshold`: 256 to 8,192, doubling
THRESHOLD_TOKENS = tuple(256 * 2**k for k in range(6))


def fsdp_threshold(
    speeds: Sequence[float] = (1e12, 2e12), *, shard: int = 2**21, repeats: int = 6
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Where FSDP's prefetch hides, MEASURED on 2 gloo ranks: each rank holds a ``shard`` of
    float32 parameters of a layer of N' = 2 x shard; the all-gather of the next layer (each rank
    sends its shard) starts asynchronously while a stand-in forward of 2 N' T FLOPs runs at
    each stand-in speed of ``speeds`` (FLOP/s), T tokens per rank over :data:`THRESHOLD_TOKENS`.
    ``measured``: the tokens from which the gather leaves under 10 % of the forward exposed.
    ``formula``: ``estimate.fsdp_overlap_min_tokens`` (N = 2, float32 gather and reduce-scatter:
    forward's and backward's thresholds are both F/B tokens) with the link's bandwidth as the
    all-gather alone measured it (the shard's bytes over its time)."""
    from course_lib.measure import hiding

    n = validate.count("shard", shard, minimum=1024, maximum=2**23)
    points, summary = hiding.speed_sweep(
        "all_gather", THRESHOLD_TOKENS, lambda t: n, lambda t: 2 * (2 * n) * t, speeds,
        repeats=repeats,
    )  # fmt: skip
    summary["formula"] = [
        estimate.fsdp_overlap_min_tokens(
            world_size=2, peak_flops=f, link_GBps=bw / 1e9, param_bytes=4, grad_bytes=4
        )
        for f, bw in zip(summary.speed, summary.bytes_per_s)
    ]
    summary["measured_over_formula"] = summary.measured / summary.formula
    return points, summary
