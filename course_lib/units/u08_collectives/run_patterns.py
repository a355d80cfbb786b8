"""Unit 08, sections 9-12 of notebooks/08_collectives.ipynb: what the collectives mean for training.

- :func:`confusion_example`: all-reduce vs all-gather on the same data ([1, 2] and [3, 4]), and
  all-gather = gather + broadcast;
- :func:`straggler`: every rank's time inside one all-reduce when some ranks arrive late
  (an all-reduce is a barrier: a slow rank makes every rank slow);
- :func:`lost_rank`: a rank that never arrives: the others wait until the timeout;
- :func:`algorithm_comparison`: ring, recursive doubling and Rabenseifner side by side (payload
  bytes, messages, time at a small and a large size);
- :func:`heldout_crossover`: the alpha-beta fit judged on sizes it did not see.

Every function launches real gloo ranks (``course_lib.launch``) and returns plain data.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial

import pandas as pd
import torch
import torch.distributed as dist

from course_lib import kit, validate
from course_lib.measure import estimate
from course_lib.measure.timing import time_collective
from course_lib.parallel import collectives as C
from course_lib.units.u08_collectives._primitives import _launch, _meter

__all__ = [
    "CONFUSION_GRADS",
    "COMPARED",
    "confusion_example",
    "straggler",
    "lost_rank",
    "algorithm_comparison",
    "heldout_crossover",
]

#: the two workers' gradients of the "all-reduce is not all-gather" example (S1)
CONFUSION_GRADS = ((1.0, 2.0), (3.0, 4.0))
#: the all-reduce algorithms section 11 compares
COMPARED = {
    "ring": C.ring_all_reduce,
    "recursive_doubling": C.recursive_doubling_all_reduce,
    "rabenseifner": C.rabenseifner_all_reduce,
}


# --------------------------------------------------------------------------------------------
# 9. all-reduce is not all-gather; all-gather = gather + broadcast
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ConfusionRow:
    """One rank of :func:`confusion_example`: its gradient and what each collective gave it."""

    grad: list[float]
    all_reduce: list[float]
    all_gather: list[float]
    gather_broadcast: list[float] = field(metadata=kit.column("gather+broadcast"))


def _confusion_worker(rank: int, world_size: int, grads: Sequence[Sequence[float]]) -> ConfusionRow:
    mine = torch.tensor(grads[rank])  # (k,)
    summed = mine.clone()
    dist.all_reduce(summed)
    gathered = [torch.empty_like(mine) for _ in range(world_size)]
    dist.all_gather(gathered, mine)
    # gather at rank 0, then broadcast what rank 0 holds
    at_root = [torch.empty_like(mine) for _ in range(world_size)]
    dist.gather(mine, at_root if rank == 0 else None, dst=0)
    flat = torch.cat(at_root) if rank == 0 else torch.empty(world_size * mine.numel())
    dist.broadcast(flat, src=0)
    return ConfusionRow(mine.tolist(), summed.tolist(), torch.cat(gathered).tolist(), flat.tolist())


def confusion_example(grads: Sequence[Sequence[float]] = CONFUSION_GRADS) -> pd.DataFrame:
    """Run all-reduce, all-gather and gather + broadcast on the same per-rank gradients (one rank
    per entry of ``grads``). One row per rank: grad, all_reduce (the element-wise sum, same shape),
    all_gather (the concatenation, N times longer), gather+broadcast (the same as all_gather)."""
    grads = [tuple(float(v) for v in g) for g in grads]
    if len(grads) < 2 or len({len(g) for g in grads}) != 1:
        raise ValueError(f"grads = {grads!r}: expected at least 2 gradients of the same length")
    rows = _launch(_confusion_worker, len(grads), grads)
    return kit.frame(rows, ConfusionRow).rename_axis("rank")


# --------------------------------------------------------------------------------------------
# 10. stragglers and lost ranks
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class StragglerRow:
    """One rank of :func:`straggler` (seconds)."""

    rank: int
    compute_s: float
    in_all_reduce_s: float
    step_s: float


def _straggler_worker(
    rank: int, world_size: int, sleeps: Sequence[float], numel: int
) -> StragglerRow:
    x = torch.ones(numel)
    dist.all_reduce(x)  # warm the connections up
    dist.barrier()
    t_start = time.perf_counter()
    time.sleep(sleeps[rank])  # this rank's "forward and backward"
    t_enter = time.perf_counter()
    dist.all_reduce(x)
    t_leave = time.perf_counter()
    return StragglerRow(rank, t_enter - t_start, t_leave - t_enter, t_leave - t_start)


def straggler(sleeps: Sequence[float], *, numel: int = 1024) -> pd.DataFrame:
    """One synchronous step per rank: rank r computes (sleeps ``sleeps[r]`` seconds), then joins
    an all-reduce of ``numel`` floats. Measured per rank: compute_s, in_all_reduce_s (from
    entering the all-reduce to leaving it) and step_s. An all-reduce cannot finish before its
    last rank has contributed, so every rank leaves at about max(sleeps): the fast ranks wait
    inside the collective. World size = len(sleeps)."""
    sleeps = [
        validate.number(f"sleeps[{i}]", s, minimum=0, maximum=30) for i, s in enumerate(sleeps)
    ]
    if len(sleeps) < 2:
        raise ValueError(f"sleeps = {sleeps!r}: expected one delay per rank, at least 2 ranks")
    numel = validate.count("numel", numel, minimum=1)
    rows = _launch(_straggler_worker, len(sleeps), sleeps, numel, timeout=60 + max(sleeps))
    return kit.frame(rows, StragglerRow).set_index("rank")


def _lost_worker(rank: int, world_size: int, lost: int) -> float:
    x = torch.ones(4)
    if rank == lost:
        time.sleep(3600)  # a hung rank: a dead GPU, a stuck data loader, a frozen node
    dist.all_reduce(x)
    return float(x[0])


def lost_rank(world_size: int = 4, *, lost: int = 3, timeout: float = 3.0) -> list[str]:
    """A rank that never reaches the all-reduce: the others cannot finish it and wait until the
    process group's ``timeout`` (seconds) ends the run. Returns the summary of the LaunchError
    that ``course_lib.launch`` raises (its first line and one line per rank, without gloo's
    source-file prefixes): the error a learner sees."""
    import re

    from course_lib.runtime.errors import LaunchError

    world_size = validate.count("world_size", world_size, minimum=2, maximum=16)
    lost = validate.count("lost", lost, minimum=0, maximum=world_size - 1)
    try:
        _launch(
            _lost_worker,
            world_size,
            lost,
            timeout=validate.number("timeout", timeout, positive=True),
        )
    except LaunchError as err:
        lines = str(err).strip().splitlines()[: world_size + 1]
        return [re.sub(r"\[[^\]]*\.cc:\d+\] ", "", line) for line in lines]
    raise RuntimeError("the all-reduce finished although one rank never joined it")


# --------------------------------------------------------------------------------------------
# 11. ring, recursive doubling, Rabenseifner
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ComparisonRow:
    """One algorithm and size of :func:`algorithm_comparison` (rank 0's calls)."""

    algorithm: str
    size_bytes: int
    payload_sent: int
    messages: int
    median_s: float
    predicted_messages: int
    predicted_bytes: float


def _compare_worker(
    rank: int, world_size: int, sizes: Sequence[int], repeats: int
) -> list[ComparisonRow]:
    log2n = world_size.bit_length() - 1
    steps = {"ring": 2 * (world_size - 1), "recursive_doubling": log2n, "rabenseifner": 2 * log2n}
    rows = []
    for size in sizes:
        x = torch.ones(size // 4)  # (S/4,) float32
        for name, fn in COMPARED.items():
            with _meter() as meter:
                fn(x)
            sends = sum(n for op, n in meter.calls.items() if "send" in op)
            t = time_collective(
                partial(fn, x), warmup=1, repeat=repeats, setup=partial(x.fill_, 1.0)
            )
            predicted = (
                estimate.recursive_doubling_allreduce_bytes_sent(size, world_size)
                if name == "recursive_doubling"
                else estimate.ring_allreduce_bytes_sent(size, world_size)
            )
            rows.append(
                ComparisonRow(
                    name,
                    size,
                    int(meter.model_bytes_sent),
                    sends,
                    statistics.median(t),
                    steps[name],
                    predicted,
                )
            )
    return rows


def algorithm_comparison(
    world_size: int = 4, sizes: Sequence[int] = (1024, 4 * 2**20), *, repeats: int = 3
) -> pd.DataFrame:
    """Ring, recursive doubling and Rabenseifner all-reduce of float32 tensors on ``world_size``
    ranks. One row per (algorithm, size): payload_sent (bytes rank 0 hands to isend, counted by
    CommMeter), messages (its isend calls), predicted_messages and predicted_bytes (the
    formulas: ring 2(N-1) messages of S/N; recursive doubling log2 N of S; Rabenseifner 2 log2 N
    messages carrying the ring's 2(N-1)/N S), median_s (slowest rank, median of ``repeats``)."""
    world_size = validate.count("world_size", world_size, minimum=2, maximum=16)
    validate.power_of_two(
        "world_size",
        world_size,
        minimum=2,
        maximum=16,
        note="recursive doubling and Rabenseifner pair ranks by bits",
    )
    sizes = [validate.count("sizes[i]", s, minimum=4 * world_size) for s in sizes]
    for s in sizes:
        validate.divisible(
            "sizes[i]",
            s,
            "4 * world_size",
            4 * world_size,
            note="float32 elements, split evenly over the ranks",
        )
    per_rank = _launch(
        _compare_worker, world_size, sizes, validate.count("repeats", repeats, minimum=1)
    )
    return kit.frame(per_rank[0], ComparisonRow)


# --------------------------------------------------------------------------------------------
# the alpha-beta fit, judged on held-out sizes
# --------------------------------------------------------------------------------------------
def heldout_crossover(
    times: pd.DataFrame, world_size: int, held_out: Sequence[int]
) -> dict[str, float | pd.DataFrame]:
    """Fit (alpha, beta) on the sizes of ``times`` (from ``time_all_reduce``) that are not in
    ``held_out``, then predict the held-out ones. Returns {"alpha", "beta", "errors" (a DataFrame:
    algorithm, size_bytes, measured_s, predicted_s, error_pct = 100 (predicted - measured) /
    measured), "model_crossover_bytes" (from the held-in fit)}."""
    from course_lib.units.u08_collectives.run_timing import (
        compare_with_model,
        fit_per_message_alpha_beta,
        model_crossover_bytes,
    )

    held = set(int(s) for s in held_out)
    missing = held - set(times["size_bytes"])
    if missing:
        raise ValueError(
            f"held_out = {sorted(held)}: sizes {sorted(missing)} were not measured; "
            f"valid choices: {sorted(set(times['size_bytes']))}"
        )
    train = times[~times["size_bytes"].isin(held)]
    if train["size_bytes"].nunique() < 2:
        raise ValueError(
            f"held_out = {sorted(held)}: expected to leave at least 2 measured sizes to fit "
            "alpha and beta on"
        )
    alpha, beta = fit_per_message_alpha_beta(train, world_size)
    test = compare_with_model(times[times["size_bytes"].isin(held)], world_size, alpha, beta)
    errors = test.assign(error_pct=100 * (test.predicted_s - test.measured_s) / test.measured_s)[
        ["algorithm", "size_bytes", "measured_s", "predicted_s", "error_pct"]
    ]
    return {
        "alpha": alpha,
        "beta": beta,
        "errors": errors.reset_index(drop=True),
        "model_crossover_bytes": model_crossover_bytes(world_size, alpha, beta),
    }
