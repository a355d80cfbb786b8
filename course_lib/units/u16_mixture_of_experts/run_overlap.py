"""Unit 16, the all-to-all's hiding point measured (``unit.run.a2a_overlap``).

On 2 gloo ranks with a stand-in device, as units 09 (§7.1), 12 (§4.1) and 15 (§8.1) do, through
``course_lib.measure.hiding``: each rank holds E/ep experts that receive c token rows each, so
A = c E / ep rows of ``hidden`` fp32 values; the dispatch and the combine of those rows (two real
``all_to_all_single`` calls, equal splits: balanced routing) run while the rank "computes" the
experts' matmuls for the time a device of F FLOP/s takes, A x 2 P_e FLOPs (P_e = 2 h f, an
ungated expert of width f; a timed sleep: the core is free meanwhile, as while a GPU computes),
then waits for them. That is the overlap DeepSeek-V3's DualPipe arranges between two
micro-batches: one's all-to-all beside the other's experts. The wait left after the compute is
the exposed communication.

Per row, compute and bytes both grow with the tokens, so what decides is the expert's width: it
hides the all-to-all iff 2 P_e / F > 2 (ep - 1)/ep h p / B per row, i.e. from f > (F/B)
(ep - 1)/ep p / 2, whatever the batch (``estimate.ep_overlap_min_tokens_per_expert`` is ``inf``
below that width). The sweep is over f at a batch large enough for the latency not to matter;
the narrowest width that hides moves up in proportion to F: a device twice as fast needs experts
twice as wide (or a link twice as fast).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd

from course_lib import validate
from course_lib.measure import estimate, hiding

__all__ = ["a2a_overlap", "narrowest_hiding_expert"]


def narrowest_hiding_expert(
    *, hidden: int, experts: int, ep: int, peak_flops: float, link_GBps: float, tokens: int,
    alpha_s: float = 0.0, dtype_bytes: int = 2, gated_mlp: bool = False,
) -> int:  # fmt: skip
    """The narrowest expert width f for which ``estimate.ep_overlap_min_tokens_per_expert``
    says ``tokens`` per expert hide the all-to-all (bisection over f; the estimate is monotone
    in f)."""

    def hides(f: int) -> bool:
        return (
            estimate.ep_overlap_min_tokens_per_expert(
                hidden=hidden,
                ffn=f,
                experts=experts,
                ep=ep,
                peak_flops=peak_flops,
                link_GBps=link_GBps,
                alpha_s=alpha_s,
                dtype_bytes=dtype_bytes,
                gated_mlp=gated_mlp,
            )  # fmt: skip
            <= tokens
        )

    lo, hi = 1, 1
    while not hides(hi):
        lo, hi = hi, 2 * hi
        if hi > 1 << 40:
            return math.inf  # type: ignore[return-value]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if hides(mid) else (mid, hi)
    return hi if not hides(lo) else lo


def a2a_overlap(
    widths: Sequence[int] = (96, 128, 192, 256, 384, 512, 768, 1024),
    *,
    tokens_per_expert: int = 4096,
    hidden: int = 256,
    experts: int = 4,
    flops: Sequence[float] = (0.25e12, 0.5e12),
    repeats: int = 2,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(points, summary)`` of ``hiding.speed_sweep("all_to_all", ...)`` on 2 ranks (ep = 2):
    per stand-in speed (FLOP/s) and expert width f (column ``x``), the compute slept
    (c E/ep 4 h f / speed, c = ``tokens_per_expert``), the MEASURED dispatch + combine of the
    c E/ep rows alone (``comm_s``; the same bytes at every width) and the wait left after the
    compute (``exposed_s``; ``ratio`` = exposed / compute). ``summary``, one row per speed:
    ``measured`` (the width from which the wait stays below 10 % of the compute), the link as
    measured (``bytes_per_s``: the rows' bytes over the two calls' time, latency included) and
    ``formula``: :func:`narrowest_hiding_expert` at that speed and the link that measurement
    gives (two calls, each moving (ep - 1)/ep of the rows: B = 2 (ep - 1)/ep x bytes_per_s),
    fp32."""
    fs_ = validate.counts("widths", widths, minimum=1)
    c = validate.count("tokens_per_expert", tokens_per_expert, minimum=1)
    h = validate.count("hidden", hidden, minimum=2)
    e = validate.count("experts", experts, minimum=2)
    ep = 2
    if e % ep or h % ep:
        raise ValueError(
            f"experts = {e}, hidden = {h}: expected multiples of ep = {ep} (equal splits)"
        )
    speeds = [validate.number("flops", v, positive=True, finite=True) for v in flops]
    reps = validate.count("repeats", repeats, minimum=1, maximum=10)
    rows = c * e // ep  # rows one rank holds for its experts
    points, summary = hiding.speed_sweep(
        "all_to_all", fs_, lambda f: rows * h, lambda f: rows * 2 * (2 * h * f), speeds,
        repeats=reps,
    )  # fmt: skip
    link = summary.bytes_per_s * 2 * (ep - 1) / ep
    summary["formula"] = [
        narrowest_hiding_expert(
            hidden=h,
            experts=e,
            ep=ep,
            peak_flops=speed,
            link_GBps=b / 1e9,
            tokens=c,
            dtype_bytes=4,
        )  # fmt: skip
        for speed, b in zip(summary.speed, link)
    ]
    return points, summary
