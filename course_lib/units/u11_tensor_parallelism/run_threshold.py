"""Unit 11, "When the all-reduces stop dominating": Megatron's g (the all-reduce after a row
split) after the matmuls it follows, measured on 2 gloo ranks with a stand-in device
(``measure.hiding.speed_sweep``, no overlap: the all-reduce sits between the matmuls that need
it), beside ``estimate.tp_overlap_min_hidden``. Used by notebooks/11_tensor_parallelism.ipynb
through :mod:`run`.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from course_lib import validate
from course_lib.measure import estimate

__all__ = ["THRESHOLD_HIDDEN", "tp_threshold"]

#: hidden sizes swept by :func:`tp_threshold`: 128 to 2,048, doubling
THRESHOLD_HIDDEN = (128, 256, 512, 1024, 2048)


def tp_threshold(
    speeds: Sequence[float] = (7.5e11, 1.5e12), *, tokens: int = 4096, repeats: int = 6
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Where tensor parallelism's all-reduces stop dominating, MEASURED on 2 gloo ranks (t = 2):
    for each hidden size h of :data:`THRESHOLD_HIDDEN`, half a layer's matmuls (12 T h^2 / t
    FLOPs: attention's or the MLP's, on ``tokens`` T) stood in for at each speed of ``speeds``
    (FLOP/s), then the all-reduce of the T x h float32 activation (g), one after the other.
    ``measured``: the h from which the all-reduce takes less time than the matmuls.
    ``formula``: ``estimate.tp_overlap_min_hidden`` (tp = 2, 4-byte values, ``tokens``) with
    the link's latency and bandwidth fitted to the all-reduce timed alone (alpha-beta, one
    all-reduce of t = 2 ranks being 2 ring steps: alpha per step = fitted alpha / 2)."""
    from course_lib.measure import hiding

    t = validate.count("tokens", tokens, minimum=64, maximum=8192)
    points, summary = hiding.speed_sweep(
        "all_reduce", THRESHOLD_HIDDEN, lambda h: t * h, lambda h: 12 * t * h * h / 2, speeds,
        overlap=False, repeats=repeats,
    )  # fmt: skip
    summary["formula"] = [
        estimate.tp_overlap_min_hidden(
            tp=2, peak_flops=f, link_GBps=bw / 1e9, tokens=t, alpha_s=a / 2, dtype_bytes=4
        )
        for f, bw, a in zip(summary.speed, summary.bytes_per_s, summary.alpha_s)
    ]
    summary["measured_over_formula"] = summary.measured / summary.formula
    return points, summary
