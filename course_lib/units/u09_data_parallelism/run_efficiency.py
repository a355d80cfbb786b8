"""Unit 09, data-parallel scaling efficiency measured: throughput at N ranks / (N x throughput at 1).

Weak scaling (S4's notion): every rank keeps its batch of ``rows`` samples, so N ranks process N
times the samples per step; efficiency = (N x rows / step time at N) / (N x rows / step time at
1) = step time at 1 / step time at N. On 2 shared cores, 4 ranks computing for real compete for
the cores, which is not what data parallelism costs on a GPU per rank. With ``stand_in=True``
each rank's forward and backward kernels are stood in for by a timed sleep of ``compute_s``
(the core is free meanwhile, as while a GPU computes); the model is still a real one, its real
backward produces the gradients and the course's ``DataParallel`` all-reduces them over gloo.
Used by notebooks/09_data_parallelism.ipynb through :mod:`run`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch

from course_lib import kit, validate
from course_lib.measure import estimate
from course_lib.runtime.launch import launch


@dataclass(frozen=True)
class EfficiencyRow:
    """One world size of :func:`scaling_efficiency`."""

    world_size: int
    step_s: float
    samples_per_s: float
    efficiency: float
    overhead_s: float
    gradient_bytes: int
    stand_in: bool


def _model(width: int) -> torch.nn.Module:
    from course_lib.models import MLP, MLPConfig

    torch.manual_seed(0)
    return MLP(MLPConfig(in_features=width, hidden=(width, width), out_features=8))


def _steps(
    model: torch.nn.Module,
    stand_in: bool,
    compute_s: float,
    x: torch.Tensor,
    y: torch.Tensor,
    steps: int,
    group: Any,
) -> list[float]:
    import torch.distributed as dist
    import torch.nn.functional as F

    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    times = []
    for step in range(steps + 1):  # the first step warms up
        dist.barrier(group=group)
        t0 = time.perf_counter()
        loss = F.mse_loss(model(x), y)
        if stand_in:
            time.sleep(compute_s)  # the kernels of forward and backward, on "the device"
        loss.backward()  # real gradients, all-reduced by DataParallel's buckets
        opt.step()
        opt.zero_grad()
        if step:
            times.append(time.perf_counter() - t0)
    return times


def _efficiency_worker(
    rank: int, world_size: int, sizes: Sequence[int], stand_in: bool, compute_s: float, width: int, rows: int,
    steps: int,
) -> dict[int, list[float]]:  # fmt: skip
    import torch.distributed as dist

    from course_lib.parallel.ddp import DataParallel

    torch.set_num_threads(1)
    x, y = torch.randn(rows, width), torch.randn(rows, 8)
    out = {}
    for n in sizes:  # one launch: the first n ranks train, the others wait (not computing)
        group = dist.new_group(list(range(n)))
        if rank < n:
            model = DataParallel(_model(width), group=group)
            out[n] = _steps(model, stand_in, compute_s, x, y, steps, group)
        dist.barrier()
    return out


def scaling_efficiency(
    world_sizes: Sequence[int] = (1, 2, 4),
    *,
    stand_in: bool = True,
    compute_s: float = 0.05,
    width: int = 256,
    rows: int = 8,
    steps: int = 5,
) -> pd.DataFrame:
    """Data-parallel scaling efficiency MEASURED on real gloo ranks: for each N in
    ``world_sizes``, ``steps`` training steps (after one warm-up) of an MLP ``width`` ->
    ``width`` -> ``width`` -> 8 (float32) under the course's DataParallel, ``rows`` samples
    per rank per step, all in one launch of max(N) ranks (the ranks beyond N wait in a barrier).
    One row per N: step_s (the shortest over steps of the slowest rank's step),
    samples_per_s (N x rows / step_s), efficiency (samples_per_s / (N x samples_per_s at the
    first N, which must be 1)), overhead_s (step_s - step_s at N = 1: the all-reduce and waits
    the data parallelism adds), gradient_bytes, stand_in."""
    sizes = validate.counts("world_sizes", world_sizes, minimum=1)
    if sizes[0] != 1:
        raise ValueError(f"world_sizes = {list(sizes)}: expected 1 first (efficiency is against 1)")
    validate.choice("stand_in", stand_in, (True, False))
    compute_s = validate.number("compute_s", compute_s, positive=True)
    if compute_s > 0.5:
        raise ValueError(f"compute_s = {compute_s}: expected at most 0.5 s per step")
    width = validate.count("width", width, minimum=2, maximum=2048)
    rows = validate.count("rows", rows, minimum=1)
    steps = validate.count("steps", steps, minimum=1, maximum=20)
    res = launch(_efficiency_worker, max(sizes), sizes, stand_in, compute_s, width, rows, steps)
    grad_bytes = sum(p.numel() * 4 for p in _model(width).parameters())
    # per N, the slowest rank's step; noise on a shared machine only lengthens a step, so the
    # fastest of those steps is the estimate
    step_s = {n: min(max(ts) for ts in zip(*(r[n] for r in res[:n]))) for n in sizes}
    one = rows / step_s[1]  # samples per second at N = 1
    return kit.frame(
        [
            EfficiencyRow(
                n, s, n * rows / s, n * rows / s / (n * one), s - step_s[1], grad_bytes, stand_in
            )
            for n, s in step_s.items()
        ],
        EfficiencyRow,
    )


#: tokens per rank swept by :func:`dp_threshold`: 256 to 8,192, doubling
THRESHOLD_TOKENS = tuple(256 * 2**k for k in range(6))


def dp_threshold(
    speeds: Sequence[float] = (1e12, 2e12), *, params: int = 2**21, repeats: int = 6
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Where data parallelism's gradient all-reduce hides behind backward, MEASURED on 2 gloo
    ranks (``measure.hiding.speed_sweep``): the gradients of ``params`` float32 parameters
    all-reduced asynchronously while a stand-in backward of 4 x params x T FLOPs runs at each
    stand-in speed of ``speeds`` (FLOP/s), T tokens per rank swept over
    :data:`THRESHOLD_TOKENS`. ``measured``: the tokens from which the all-reduce leaves under
    10 % of the backward exposed (``hiding.crossing``). ``formula``: ``estimate.dp_overlap_min_tokens`` (N = 2, 4-byte
    gradients: F/B tokens) with the link's bandwidth as the all-reduce alone measured it."""
    from course_lib.measure import hiding

    n = validate.count("params", params, minimum=1024, maximum=2**23)
    points, summary = hiding.speed_sweep(
        "all_reduce", THRESHOLD_TOKENS, lambda t: n, lambda t: 4 * n * t, speeds, repeats=repeats
    )
    summary["formula"] = [
        estimate.dp_overlap_min_tokens(world_size=2, peak_flops=f, link_GBps=bw / 1e9, grad_bytes=4)
        for f, bw in zip(summary.speed, summary.bytes_per_s)
    ]
    summary["measured_over_formula"] = summary.measured / summary.formula
    return points, summary
