"""Unit 12, "When the sends hide": a stage's send of one micro-batch's activation beside its
compute of the next, measured on 2 gloo ranks with a stand-in device
(``measure.hiding.speed_sweep``), beside ``estimate.pp_transfer_to_compute``; and the
micro-batches a bubble below a target needs, ``estimate.pp_bubble_micro_batches`` (the bubble
itself is measured in the lecture's section 4.1). Used by
notebooks/12_pipeline_parallelism.ipynb through :mod:`run`.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from course_lib import validate
from course_lib.measure import estimate

__all__ = ["THRESHOLD_HIDDEN", "pp_threshold"]

#: hidden sizes swept by :func:`pp_threshold`: 128 to 2,048, doubling
THRESHOLD_HIDDEN = (128, 256, 512, 1024, 2048)


def pp_threshold(
    speeds: Sequence[float] = (4e12, 8e12),
    *,
    tokens: int = 4096,
    layers: int = 1,
    repeats: int = 6,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Where a pipeline's stage-to-stage sends hide, MEASURED on 2 gloo ranks: each rank sends
    the T x h float32 activation of one micro-batch (T = ``tokens``) to the other and receives
    the other's, asynchronously, while a stand-in stage of ``layers`` layers computes the next
    micro-batch, 24 T h^2 x layers FLOPs at each speed of ``speeds`` (FLOP/s), h over
    :data:`THRESHOLD_HIDDEN`. ``measured``: the h from which the send leaves under 20 % of the
    compute exposed (a send's wake-ups leave a floor of about a millisecond exposed, which 10 %
    of the small computes near the crossing would not cover). ``formula``: the h at which ``estimate.pp_transfer_to_compute`` (4-byte
    values) is 1, with the link's latency and bandwidth fitted to the exchange timed alone (the
    ratio falls as 1/h, so that h is the ratio at any h times h)."""
    from course_lib.measure import hiding

    t = validate.count("tokens", tokens, minimum=64, maximum=8192)
    n = validate.count("layers", layers, minimum=1, maximum=8)
    points, summary = hiding.speed_sweep(
        "send_recv", THRESHOLD_HIDDEN, lambda h: t * h, lambda h: 24 * t * h * h * n, speeds,
        repeats=repeats, level=0.2,
    )  # fmt: skip
    h0 = THRESHOLD_HIDDEN[0]
    summary["formula"] = [
        h0
        * estimate.pp_transfer_to_compute(
            hidden=h0, layers=n, peak_flops=f, link_GBps=bw / 1e9, dtype_bytes=4
        )
        for f, bw in zip(summary.speed, summary.bytes_per_s)
    ]
    summary["measured_over_formula"] = summary.measured / summary.formula
    return points, summary
