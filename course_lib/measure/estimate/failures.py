"""Failures and checkpoints: how often to save, what a failure costs, how big a checkpoint is.

Introduced in notebooks/18_failures_and_checkpoints.ipynb. Sources: Young 1974, "A first order
approximation to the optimum checkpoint interval" (Communications of the ACM 17(9), 530-531):
tau = sqrt(2 delta M); Daly 2006, "A higher order estimate of the optimum checkpoint interval for
restart dumps" (Future Generation Computer Systems 22(3), 303-312): the expected wall time of a
job with exponentially distributed failures, restart cost R included, and the higher-order
optimum; Llama Team 2024, "The Llama 3 herd of models" (arXiv:2407.21783, Sec. 3.3.4): 466 job
interruptions in 54 days of pre-training on up to 16,384 H100s, 419 of them unexpected.

Failures are assumed independent and exponential (a constant rate 1 / mtbf_s for the whole
job): real failure rates bunch up (new hardware, bad nodes), which is where these formulas are
optimistic.
"""

from __future__ import annotations

import math
from typing import Literal

from course_lib import validate as _v

__all__ = [
    "IntervalMethod",
    "INTERVAL_METHODS",
    "optimal_interval",
    "goodput",
    "job_mtbf",
    "checkpoint_size_bytes",
]

#: how the optimal interval is computed: Young's first-order sqrt(2 delta M), or Daly's
#: higher-order estimate
IntervalMethod = Literal["young", "daly"]
INTERVAL_METHODS: tuple[IntervalMethod, ...] = ("young", "daly")


def optimal_interval(save_s: float, mtbf_s: float, *, method: IntervalMethod = "young") -> float:
    """Seconds of training between two checkpoints that waste the least time.

    ``save_s`` (delta): seconds the run is blocked writing one checkpoint; ``mtbf_s`` (M): mean
    time between failures of the whole job. ``"young"``: sqrt(2 delta M) (Young 1974).
    ``"daly"``: sqrt(2 delta M) [1 + sqrt(delta / 2M) / 3 + (delta / 2M) / 9] - delta for
    delta < 2M, else M (Daly 2006). Neither depends on the restart time R: R is paid
    once per failure whatever the interval."""
    d = _v.number("save_s", save_s, positive=True)
    m = _v.number("mtbf_s", mtbf_s, positive=True)
    method = _v.choice("method", method, INTERVAL_METHODS)
    young = math.sqrt(2 * d * m)
    if method == "young":
        return young
    if d >= 2 * m:
        return m
    x = d / (2 * m)
    return young * (1 + math.sqrt(x) / 3 + x / 9) - d


def goodput(interval_s: float, save_s: float, mtbf_s: float, *, restart_s: float = 0.0) -> float:
    """Fraction of wall-clock time spent on training that is kept (0-1).

    Daly 2006's expected wall time for T_s seconds of work, with a checkpoint of ``save_s``
    (delta) after every ``interval_s`` (tau) of work, failures at rate 1 / ``mtbf_s`` (M) and
    ``restart_s`` (R: detect, re-queue, start the process groups, load the checkpoint) per
    failure: T_w = M e^(R/M) (e^((tau + delta)/M) - 1) T_s / tau; goodput = T_s / T_w. Without
    failures (M -> infinity) it is tau / (tau + delta): the time spent saving."""
    tau = _v.number("interval_s", interval_s, positive=True)
    d = _v.number("save_s", save_s, minimum=0.0)
    m = _v.number("mtbf_s", mtbf_s, positive=True)
    r = _v.number("restart_s", restart_s, minimum=0.0)
    return tau / (m * math.exp(r / m) * math.expm1((tau + d) / m))


def job_mtbf(duration_s: float, interruptions: int) -> float:
    """Mean time between failures of a job that saw ``interruptions`` in ``duration_s``
    seconds (Llama 3 405B: 54 days, 419 unexpected interruptions -> about 3.1 hours)."""
    t = _v.number("duration_s", duration_s, positive=True)
    return t / _v.count("interruptions", interruptions, minimum=1)


def checkpoint_size_bytes(
    n_params: int, *, param_bytes: int = 2, master_bytes: int = 4, state_bytes: int = 8
) -> int:
    """Bytes of a full training checkpoint: weights (bf16: 2), fp32 master copy (4) and Adam's
    two fp32 moments (8): 14 B per parameter by default (405B -> about 5.7 TB)."""
    n = _v.count("n_params", n_params, minimum=1)
    per = sum(
        _v.count(name, v)
        for name, v in (
            ("param_bytes", param_bytes),
            ("master_bytes", master_bytes),
            ("state_bytes", state_bytes),
        )
    )
    return n * per
