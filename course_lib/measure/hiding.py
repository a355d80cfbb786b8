"""Where communication hides, measured on real ranks with a stand-in device.

The thresholds of ``estimate.overlap`` compare compute time with communication time. On a CPU
shared by its ranks, real compute would measure the contention for cores, so compute is stood in
for by a timed sleep (the core is free meanwhile, as it is while a GPU computes: the method of
units 09 Sec. 7.1 and 12 Sec. 4.1), its length set by a stand-in speed in FLOP/s: a known
"device", made slower or faster by a known factor. The communication is real: gloo collectives
and sends between real processes, timed on each rank.

:func:`hiding_sweep` runs, for each point of a sweep, the collective alone (``comm_s``), then a
"step": with ``overlap`` the collective started asynchronously while the stand-in computes,
waited for after it (DDP's buckets, FSDP's prefetch, a pipeline's sends); without, the two one
after the other (tensor parallelism's all-reduces between the matmuls that need them).
:func:`crossing` finds, in a measured sweep, where the step stops being set by communication.
Used by units 09-12, 15 and 16.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import pandas as pd

from course_lib import validate as _v

__all__ = ["OPS", "hiding_sweep", "crossing", "speed_sweep"]

#: what travels: "all_reduce" (every rank's buffer summed), "all_gather" (each rank's buffer is
#: its shard of a world_size times larger tensor), "send_recv" (each rank sends its buffer to the
#: next rank and receives the previous one's, as a pipeline or a ring step does), "all_to_all"
#: (two ``all_to_all_single`` of the buffer in equal splits: an expert layer's dispatch and
#: combine, each rank keeping 1/world_size of its rows)
OPS = ("all_reduce", "all_gather", "send_recv", "all_to_all")


def _start(op: str, buf: Any, out: Any, rank: int, world: int) -> list[Any]:
    """Start ``op`` asynchronously; the handles to wait for."""
    import torch.distributed as dist

    if op == "all_reduce":
        return [dist.all_reduce(buf, async_op=True)]
    if op == "all_gather":
        return [dist.all_gather(out, buf, async_op=True)]
    if op == "all_to_all":
        return [dist.all_to_all_single(o, buf, async_op=True) for o in out]
    return [dist.isend(buf, (rank + 1) % world), dist.irecv(out[0], (rank - 1) % world)]


def _time_point(
    op: str, buf: Any, out: Any, compute_s: float, overlap: bool, rank: int, world: int
) -> tuple[float, float, float]:
    """(comm alone, step, slept) seconds of one repeat on this rank."""
    import torch.distributed as dist

    dist.barrier()
    t0 = time.perf_counter()
    for h in _start(op, buf, out, rank, world):
        h.wait()
    comm = time.perf_counter() - t0
    dist.barrier()
    t0 = time.perf_counter()
    handles = _start(op, buf, out, rank, world) if overlap else []
    s0 = time.perf_counter()
    time.sleep(compute_s)  # the stand-in device computes; the core is free
    slept = time.perf_counter() - s0
    for h in handles if overlap else _start(op, buf, out, rank, world):
        h.wait()
    return comm, time.perf_counter() - t0, slept


def _worker(
    rank: int, world: int, op: str, numels: list[int], compute: list[float], overlap: bool,
    repeats: int,
) -> list[tuple[float, ...]]:  # fmt: skip
    import torch

    bufs = [torch.ones(n) for n in numels]
    count = {"all_gather": world, "all_to_all": 2}.get(op, 1)
    outs = [[torch.empty(n) for _ in range(count)] for n in numels]
    runs: list[list[tuple[float, float, float]]] = [[] for _ in numels]
    for _ in range(repeats + 1):  # rounds over the whole sweep: a busy spell hits one point once
        for i, c in enumerate(compute):
            runs[i].append(_time_point(op, bufs[i], outs[i], c, overlap, rank, world))
    # the first round warms up; noise on a shared machine only ever adds time
    return [tuple(min(r[k] for r in point[1:]) for k in range(3)) for point in runs]


def hiding_sweep(
    op: str,
    numels: Sequence[int],
    compute_s: Sequence[float],
    *,
    overlap: bool = True,
    world_size: int = 2,
    repeats: int = 3,
) -> pd.DataFrame:
    """Measure ``op`` (one of :data:`OPS`) on ``world_size`` gloo ranks at each point: a float32
    buffer of ``numels[i]`` elements per rank beside a stand-in compute of ``compute_s[i]``
    seconds (a sleep), with or without ``overlap``. The whole sweep is run ``repeats`` times after
    a warm-up round (rounds, not repeats of one point back to back, so that a busy spell of a
    shared machine lengthens one run of several points rather than every run of one); each rank
    keeps its shortest time of each point, and the slowest rank's is reported.

    Columns: ``numel``, ``bytes`` (the buffer, 4 numel), ``compute_s`` (asked), ``slept_s``
    (measured), ``comm_s`` (the collective alone, measured), ``step_s`` (measured), ``exposed_s``
    (step - slept: the communication compute did not hide)."""
    op = _v.choice("op", op, OPS)
    ns = _v.counts("numels", numels, minimum=1)
    cs = [_v.number("compute_s", c, minimum=0, maximum=1.0) for c in compute_s]
    if len(cs) != len(ns):
        raise ValueError(f"compute_s = {_v.describe(cs)}: expected one per numel ({len(ns)})")
    if not isinstance(overlap, bool):
        raise TypeError(f"overlap = {overlap!r}: expected True or False")
    world = _v.count("world_size", world_size, minimum=2, maximum=4)
    reps = _v.count("repeats", repeats, minimum=1, maximum=10)
    if op == "all_to_all" and any(n % world for n in ns):
        raise ValueError(
            f"numels = {_v.describe(ns)}: expected multiples of world_size = {world} for "
            "all_to_all (equal splits)"
        )
    from course_lib.runtime.launch import launch

    res = launch(_worker, world, op, ns, cs, overlap, reps, backend="gloo")
    rows = []
    for i, (n, c) in enumerate(zip(ns, cs)):
        comm, step, slept = (max(r[i][k] for r in res) for k in range(3))
        rows.append(dict(numel=n, bytes=4 * n, compute_s=c, slept_s=slept, comm_s=comm,
                         step_s=step, exposed_s=max(0.0, step - slept)))  # fmt: skip
    return pd.DataFrame(rows)


def crossing(x: Sequence[float], ratio: Sequence[float], level: float) -> float:
    """Where a measured ``ratio`` (e.g. exposed / compute) falls to ``level`` along ``x``
    (increasing): at the first point at or below ``level`` whose next point is too (one point
    below on its own is taken for noise), interpolated on log x from the point before it;
    ``x[0]`` when the first two already are, ``nan`` when no such point exists."""
    xs = [_v.number("x", v, positive=True) for v in x]
    ys = [_v.number("ratio", v) for v in ratio]
    lv = _v.number("level", level)
    if len(xs) != len(ys) or len(xs) < 2 or any(b <= a for a, b in zip(xs, xs[1:])):
        raise ValueError(f"x = {_v.describe(xs)}: expected >= 2 increasing values, one per ratio")
    for i, y in enumerate(ys):
        if y <= lv and (i == len(ys) - 1 or ys[i + 1] <= lv):
            if i == 0:
                return xs[0]
            f = (ys[i - 1] - lv) / (ys[i - 1] - y)
            return math.exp(math.log(xs[i - 1]) + f * (math.log(xs[i]) - math.log(xs[i - 1])))
    return math.nan


def speed_sweep(
    op: str,
    xs: Sequence[int],
    numel_of: Callable[[int], int],
    flops_of: Callable[[int], float],
    speeds: Sequence[float],
    *,
    overlap: bool = True,
    level: float = 0.1,
    repeats: int = 2,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One :func:`hiding_sweep` over ``xs`` (tokens, a width...) at each stand-in speed of
    ``speeds`` (FLOP/s): the buffer of x has ``numel_of(x)`` elements, its compute takes
    ``flops_of(x) / speed`` seconds. One launch for all speeds, interleaved point by point.

    Returns ``(points, summary)``. ``points``: :func:`hiding_sweep`'s columns with ``speed`` and
    ``x``, and ``ratio``: exposed / slept with ``overlap`` (what compute did not hide, over the
    compute), the communication's time over the compute's without (the step is their sum).
    ``summary``, one row per speed: ``measured`` = :func:`crossing` of ratio to ``level`` (with
    overlap; 1 without: where communication stops dominating), and the link as measured alone:
    ``alpha_s``, ``bytes_per_s`` (:func:`estimate.fit_alpha_beta`, relative, over every point's
    ``comm_s``; bandwidth = buffer bytes / median time of the largest buffer when every buffer is
    the same size, or when the fit finds no time growing with size: noise beat the sizes)."""
    from course_lib.measure import estimate

    sp = [_v.number("speeds", v, positive=True, finite=True) for v in speeds]
    grid = _v.counts("xs", xs, minimum=1)
    # the speeds interleaved point by point, so that a busy spell of the machine hits them alike
    numels = [numel_of(x) for x in grid for _ in sp]
    compute = [flops_of(x) / f for x in grid for f in sp]
    df = hiding_sweep(op, numels, compute, overlap=overlap, repeats=repeats)
    df.insert(0, "x", [x for x in grid for _ in sp])
    df.insert(0, "speed", [f for _ in grid for f in sp])
    df = df.sort_values(["speed", "x"], kind="stable", ignore_index=True)
    df["ratio"] = df.exposed_s / df.slept_s if overlap else (df.step_s - df.slept_s) / df.slept_s
    alpha, beta = 0.0, 0.0
    if len(set(numels)) > 1:
        alpha, beta = estimate.fit_alpha_beta(df.bytes, df.comm_s, relative=True)
    if beta > 0:
        alpha, bw = max(alpha, 0.0), 1 / beta
    else:  # one size, or sizes so close that noise beat them: the largest buffer alone
        largest = df[df.bytes == df.bytes.max()]
        alpha, bw = 0.0, float(largest.bytes.iloc[0]) / float(largest.comm_s.median())
    rows = []
    for f, g in df.groupby("speed", sort=False):
        cut = crossing(g.x, g.ratio, level if overlap else 1.0)
        rows.append(dict(speed=f, measured=cut, alpha_s=alpha, bytes_per_s=bw))
    return df, pd.DataFrame(rows)
