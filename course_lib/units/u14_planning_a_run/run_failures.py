"""Unit 14, section 5 (notebooks/14_planning_a_run.ipynb): what breaks at scale, on paper.
Re-exported by :mod:`run`. Failures per day scaled from Llama 3's, a checkpoint's cost by
Young's interval, what a restart adds (Daly's model, ``estimate.goodput``: the one unit 18
measures against), and stragglers. Models, not measurements: unit 18 measures the pieces."""

from __future__ import annotations

import math

from course_lib import plan as P
from course_lib import validate as _v
from course_lib.measure import estimate

__all__ = [
    "LLAMA3_DAYS",
    "LLAMA3_GPUS",
    "LLAMA3_UNEXPECTED",
    "checkpoint_cost",
    "failures_at_scale",
    "restart_table",
    "straggler_table",
]


# Llama 3 405B pre-training (Llama Team 2024, arXiv:2407.21783, Sec. 3.3.4 and Table 5): 466
# interruptions in a 54-day snapshot on 16,384 H100s, 419 of them unexpected; about 78 % of the
# unexpected ones confirmed or suspected hardware; storage 2 TB/s sustained, 7 TB/s peak.
LLAMA3_UNEXPECTED, LLAMA3_DAYS, LLAMA3_GPUS = 419, 54, 16384


def failures_at_scale(gpus=(8, 64, 512, 2048, 16384), *, days: float = 54):
    """Unexpected interruptions per day and the mean time between them for a job on ``gpus``
    GPUs, scaling Llama 3's 419 in 54 days at 16,384 GPUs by the GPU count (each GPU fails
    independently at the same rate), and how many a ``days``-long run meets."""
    import pandas as pd

    per_gpu_day = LLAMA3_UNEXPECTED / (LLAMA3_DAYS * LLAMA3_GPUS)
    rows = []
    for n in gpus:
        per_day = per_gpu_day * _v.count("gpus", n, minimum=1)
        rows.append(
            {
                "GPUs": n,
                "failures per day": per_day,
                "hours between failures": 24 / per_day,
                f"failures in {days:g} days": per_day * days,
            }
        )
    return pd.DataFrame(rows)


def checkpoint_cost(
    model: str = "Llama-3-405B", *, write_GBps: float = 2000.0, mtbf_hours: float | None = None
) -> dict[str, float]:
    """A full checkpoint's size (bf16 weights + fp32 master + Adam: 2 + 12 B/param), its write
    time at ``write_GBps`` (Llama 3's storage sustains 2 TB/s), Young's optimal interval
    sqrt(2 delta M) between checkpoints (Young 1974, CACM 17(9)) for the mean time between
    failures M (default: Llama 3's, 54 days x 24 h / 419), and the fraction of time lost to
    writing plus redoing half an interval after each failure."""
    spec = P.model(model)
    size = (2 + 12) * spec.n_params
    write_s = size / (_v.number("write_GBps", write_GBps, positive=True) * 1e9)
    mtbf = (LLAMA3_DAYS * 24 / LLAMA3_UNEXPECTED if mtbf_hours is None else mtbf_hours) * 3600
    interval = math.sqrt(2 * write_s * mtbf)
    return {
        "size_TB": size / 1e12,
        "weights_TB": 2 * spec.n_params / 1e12,
        "write_s": write_s,
        "mtbf_h": mtbf / 3600,
        "interval_min": interval / 60,
        "lost_fraction": write_s / interval + interval / (2 * mtbf),
    }


def straggler_table(gpus=(8, 512, 16384), *, p_slow: float = 1e-5, slowdown: float = 2.0):
    """A synchronous step waits for its slowest GPU. If each GPU is independently slow (by
    ``slowdown``x) in a step with probability ``p_slow``, a step is slow with probability
    1 - (1 - p)^N, and the mean step costs 1 + (slowdown - 1) times that. A model, not a
    measurement: it shows why a rare hiccup per GPU becomes a steady tax at 16K GPUs."""
    import pandas as pd

    p = _v.number("p_slow", p_slow, minimum=0, maximum=1)
    rows = []
    for n in gpus:
        slow = 1 - (1 - p) ** _v.count("gpus", n, minimum=1)
        rows.append(
            {"GPUs": n, "P(step is slow)": slow, "mean step / ideal": 1 + (slowdown - 1) * slow}
        )
    return pd.DataFrame(rows)


def restart_table(restarts_min=(0, 5, 10, 20, 30), **cost):
    """The share of the run lost at Young's interval when each failure also costs a restart of
    R minutes (detect, re-queue, reload the checkpoint, warm up), by Daly's model
    (``estimate.goodput``, as unit 18 uses it), for :func:`checkpoint_cost`'s run (``cost``: its
    arguments). Llama 3 reports > 90 % effective training time (arXiv:2407.21783, Sec. 3.3.4)
    without its restart time: the row where the loss passes 10 % says how fast a restart had
    to be."""
    import pandas as pd

    c = checkpoint_cost(**cost)
    mtbf_s, interval_s = c["mtbf_h"] * 3600, c["interval_min"] * 60
    rows = []
    for r in restarts_min:
        r_s = 60 * _v.number("restart_min", r, minimum=0)
        kept = estimate.goodput(interval_s, c["write_s"], mtbf_s, restart_s=r_s)
        rows.append({"restart_min": r, "lost_fraction": 1 - kept, "goodput": kept})
    return pd.DataFrame(rows)
