"""Unit 08, section 4: all-reduce time, ring vs recursive doubling vs gloo, and the alpha-beta fit.

Used by notebooks/08_collectives.ipynb through :mod:`run` (which re-exports these names).
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd
import torch
import torch.distributed as dist

from course_lib import kit, validate
from course_lib.measure import estimate
from course_lib.measure.estimate.links import AllreduceAlgorithm
from course_lib.measure.timing import time_collective
from course_lib.parallel import collectives as C
from course_lib.units.u08_collectives._primitives import TIMED, _launch


# --------------------------------------------------------------------------------------------
# 4. time: ring vs recursive doubling vs gloo, and the alpha-beta fit
# --------------------------------------------------------------------------------------------
def _timing_worker(
    rank: int, world_size: int, numel: int, algorithms: Sequence[str], repeats: int, warmup: int
) -> dict[str, list[float]]:
    x = torch.randn(numel)  # (S,) float32
    times: dict[str, list[float]] = {}
    for algorithm in algorithms:
        fn = dist.all_reduce if algorithm == "gloo" else C.ALL_REDUCE_ALGORITHMS[algorithm]
        # x.fill_ keeps values finite however many times we sum them; per-rank samples
        times[algorithm] = time_collective(
            functools.partial(fn, x),
            warmup=warmup,
            repeat=repeats,
            setup=lambda: x.fill_(1.0),
            max_over_ranks=False,
        )
    return times


def time_all_reduce(
    sizes_bytes: Sequence[int],
    *,
    world_size: int = 4,
    algorithms: Sequence[str] = ("ring", "recursive_doubling", "gloo"),
    repeats: int = 5,
    warmup: int = 1,
    progress: bool = True,
    timeout: float = 300.0,
) -> pd.DataFrame:
    """Time all-reduce of float32 tensors of each size on ``world_size`` ranks (one launch per size).

    A sample is the slowest rank's time for one call (the collective is done when its last rank
    is), after a barrier; we report the median and the quartiles over ``repeats`` samples, in
    seconds. On a shared CPU machine absolute times are noisy: compare algorithms within a run.
    Columns: algorithm, size_bytes, median_s, p25_s, p75_s, repeats.
    """
    world_size = validate.count("world_size", world_size, minimum=2, maximum=16)
    algorithms = [validate.choice("algorithms[i]", a, TIMED) for a in algorithms]
    if "recursive_doubling" in algorithms:
        validate.power_of_two(
            "world_size", world_size, minimum=2, maximum=16, note="recursive_doubling needs one"
        )
    repeats = validate.count("repeats", repeats, minimum=1)
    warmup = validate.count("warmup", warmup, minimum=0)
    sizes = validate.counts("sizes_bytes", sizes_bytes, minimum=4)
    for s in sizes:
        if s % 4:
            raise ValueError(
                f"sizes_bytes = {sizes}: expected multiples of 4 (float32); {s} is not"
            )
    if progress:
        from tqdm.auto import tqdm

        sizes_iter = tqdm(sizes, desc=f"all-reduce sweep on {world_size} ranks", unit="size")
    else:
        sizes_iter = sizes
    rows = []
    for size in sizes_iter:
        per_rank = _launch(
            _timing_worker, world_size, size // 4, algorithms, repeats, warmup, timeout=timeout
        )
        rows += [_timing_row(per_rank, a, size, repeats) for a in algorithms]
    return kit.frame(rows, TimingRow)


@dataclass(frozen=True)
class TimingRow:
    """One algorithm and size of :func:`time_all_reduce` (seconds per call)."""

    algorithm: str
    size_bytes: int
    median_s: float
    p25_s: float
    p75_s: float
    repeats: int


def _timing_row(
    per_rank: list[dict[str, list[float]]], algorithm: str, size: int, repeats: int
) -> TimingRow:
    """Median and quartiles of the slowest rank's time per call (a call ends with its last rank)."""
    slowest = [max(rank[algorithm][i] for rank in per_rank) for i in range(repeats)]
    q = statistics.quantiles(slowest, n=4) if repeats > 1 else [slowest[0]] * 3
    return TimingRow(algorithm, size, statistics.median(slowest), q[0], q[2], repeats)


def _steps_and_message(algorithm: str, size_bytes: float, world_size: int) -> tuple[int, float]:
    """(number of sequential message steps, bytes per message) of an all-reduce algorithm."""
    if validate.choice("algorithm", algorithm, ("ring", "recursive_doubling")) == "ring":
        return 2 * (world_size - 1), size_bytes / world_size
    return math.ceil(math.log2(world_size)), size_bytes


def fit_per_message_alpha_beta(
    times: pd.DataFrame, world_size: int, algorithms: Sequence[str] = ("ring", "recursive_doubling")
) -> tuple[float, float]:
    """Fit one (alpha, beta) to the all-reduce timings of the given from-scratch algorithms.

    Both algorithms are sequences of message steps (ring: 2(N-1) steps of S/N bytes; recursive
    doubling: log2 N steps of S bytes), so every measurement gives a point (bytes per message,
    time per step) on the single-message line T = alpha + beta * m, which
    ``estimate.fit_alpha_beta`` fits by least squares of the relative error (so the small
    messages, which measure alpha, count as much as the large ones, which measure beta).
    Returns (alpha in s, beta in s/byte).
    """
    xs, ys = [], []
    for algorithm in algorithms:
        sub = times[times.algorithm == algorithm]
        for size, t in zip(sub.size_bytes, sub.median_s):
            steps, message = _steps_and_message(algorithm, size, world_size)
            xs.append(message)
            ys.append(t / steps)
    return estimate.fit_alpha_beta(xs, ys, relative=True)


@dataclass(frozen=True)
class ModelFitRow:
    """One algorithm and size of :func:`compare_with_model` (seconds per call)."""

    algorithm: str
    size_bytes: int
    measured_s: float
    predicted_s: float
    residual_s: float  # measured - predicted
    ratio: float  # measured / predicted


def compare_with_model(
    times: pd.DataFrame,
    world_size: int,
    alpha: float,
    beta: float,
    algorithms: Sequence[str] = ("ring", "recursive_doubling"),
) -> pd.DataFrame:
    """Measured median beside ``estimate.allreduce_time`` with the fitted alpha and beta.

    Columns: algorithm, size_bytes, measured_s, predicted_s, residual_s (measured - predicted),
    ratio (measured / predicted).
    """
    sub = times[times.algorithm.isin(list(algorithms))]
    rows = []
    for a, s, measured in zip(sub.algorithm, sub.size_bytes, sub.median_s):
        predicted = estimate.allreduce_time(
            s, world_size, alpha=max(alpha, 0.0), beta=max(beta, 1e-15), algorithm=a
        )
        rows.append(
            ModelFitRow(a, s, measured, predicted, measured - predicted, measured / predicted)
        )
    return kit.frame(rows, ModelFitRow)


def model_crossover_bytes(world_size: int, alpha: float, beta: float) -> float:
    """Message size where the alpha-beta model says ring and recursive doubling take equal time.

    ring: 2(N-1) alpha + 2(N-1)/N S beta;  recursive doubling: log2 N (alpha + S beta).
    Found by bisection on ``estimate.allreduce_time`` (so it always agrees with the plotted
    curves); ``inf`` when the ring never wins in the model.
    """
    a, b = max(alpha, 0.0), max(beta, 1e-15)

    def gap(s: float) -> float:  # > 0 while recursive doubling is faster
        return estimate.allreduce_time(
            s, world_size, alpha=a, beta=b, algorithm="ring"
        ) - estimate.allreduce_time(s, world_size, alpha=a, beta=b, algorithm="recursive_doubling")

    lo, hi = 0.0, 1.0
    while gap(hi) > 0:
        hi *= 2
        if hi > 2**60:
            return math.inf
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if gap(mid) > 0 else (lo, mid)
    return hi


def measured_crossover_bytes(times: pd.DataFrame) -> float | None:
    """Smallest measured size from which the ring is faster than recursive doubling at every
    larger size too (None if it never is)."""
    ring = times[times.algorithm == "ring"].set_index("size_bytes").median_s
    rd = times[times.algorithm == "recursive_doubling"].set_index("size_bytes").median_s
    sizes = sorted(set(ring.index) & set(rd.index))
    crossover = None
    for size in reversed(sizes):
        if ring[size] < rd[size]:
            crossover = size
        else:
            break
    return crossover


def model_curves(
    sizes_bytes: Sequence[float],
    world_size: int,
    alpha: float,
    beta: float,
    algorithms: Sequence[AllreduceAlgorithm] = ("ring", "recursive_doubling"),
) -> pd.DataFrame:
    """``estimate.allreduce_time`` on a grid of sizes, for drawing the model's lines.
    Columns: algorithm, size_bytes, predicted_s."""
    a_, b_ = max(alpha, 0.0), max(beta, 1e-15)
    return kit.frame(
        [
            CurveRow(a, s, estimate.allreduce_time(s, world_size, alpha=a_, beta=b_, algorithm=a))
            for a in algorithms
            for s in sizes_bytes
        ],
        CurveRow,
    )


@dataclass(frozen=True)
class CurveRow:
    """One algorithm and size of :func:`model_curves` (seconds per call)."""

    algorithm: str
    size_bytes: float
    predicted_s: float
