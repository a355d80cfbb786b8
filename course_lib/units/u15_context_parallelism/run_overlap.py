"""Unit 15, §8.1: when does ring attention hide its K/V transfer? (``unit.run.ring_overlap``)

Measured on 2 gloo ranks with a stand-in device, as units 09 (§7.1) and 12 (§4.1) do, through
``course_lib.measure.hiding``: each ring step sends the real K/V block (2 n d fp32 values) to the
next rank and receives the previous rank's while the rank "computes" for the time a device of
``flops`` FLOP/s would take for the step's attention, 4 n^2 d FLOPs (a timed sleep: the core is
free meanwhile, as while a GPU computes), then waits for the block. The wait left after the
compute is the exposed communication; the same blocks sent with nothing beside them measure the
link. ``estimate.cp_ring_overlap_min_tokens`` with this F and the measured bandwidth B says from
which n the wait vanishes; a device twice as fast must move that n up twice as far.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from course_lib import validate
from course_lib.measure import estimate, hiding

__all__ = ["ring_overlap"]


def ring_overlap(
    tokens: Sequence[int] = (256, 512, 1024, 2048, 4096),
    *,
    width: int = 1024,
    flops: Sequence[float] = (0.25e12, 0.5e12),
    repeats: int = 3,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(points, summary)`` of ``hiding.speed_sweep("send_recv", ...)`` on 2 ranks: per stand-in
    speed (FLOP/s) and tokens per rank n (column ``x``), the compute slept (4 n^2 ``width`` /
    speed), the MEASURED transfer of the 2 n ``width`` fp32 block alone (``comm_s``) and the wait
    left after the compute (``exposed_s``; ``ratio`` = exposed / compute). ``summary``, one row
    per speed: ``measured`` (the n from which the wait stays below 10 % of the compute), the
    link as measured (``alpha_s``, ``bytes_per_s``) and ``formula``:
    ``estimate.cp_ring_overlap_min_tokens`` at that speed and the measured bandwidth (full
    multi-head attention, fp32: 2 F / B)."""
    ns = validate.counts("tokens", tokens, minimum=1)
    w = validate.count("width", width, minimum=1)
    fs = [validate.number("flops", f, positive=True, finite=True) for f in flops]
    reps = validate.count("repeats", repeats, minimum=1, maximum=10)
    points, summary = hiding.speed_sweep(
        "send_recv", ns, lambda n: 2 * n * w, lambda n: 4 * n * n * w, fs, repeats=reps
    )
    summary["formula"] = [
        estimate.cp_ring_overlap_min_tokens(
            heads=1, kv_heads=1, peak_flops=f, link_GBps=bw / 1e9, dtype_bytes=4
        )
        for f, bw in zip(summary.speed, summary.bytes_per_s)
    ]
    return points, summary
