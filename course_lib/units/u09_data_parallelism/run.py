"""Unit 09's measured runs (notebooks/09_data_parallelism.ipynb): data parallelism on real ranks.

Every run goes through ``course_lib.launch`` (gloo on CPU; NCCL with one GPU per rank) and uses
the course's from-scratch ``parallel.ddp`` (``DataParallel``, ``allreduce_gradients``) beside
torch's ``DistributedDataParallel``. Each function returns plain data or a tidy DataFrame:

- :func:`worked_example`: the sources' four gradients averaged on 4 real ranks, one SGD step;
- :func:`parity`: 3 AdamW steps on 1..4 ranks against one process on the full batch (harness);
- :func:`bucket_assignment`: our buckets beside torch's DDP's (its logging data), per cap;
- :func:`bytes_per_step`: all-reduce calls and bytes each rank puts on the wire per step, naive
  (one all-reduce per parameter) and bucketed, beside 2(N-1)/N x gradient bytes;
- :func:`ddp_bucket_sweep` (``measure.bucket_sweep``): bucket caps swept for our DataParallel
  and torch's DDP, with a per-rank timeline of backward and bucket all-reduces;
- :func:`accumulation_traffic`: K micro-steps, ``no_sync`` or not; :func:`straggler`: a slow rank;
- :func:`accumulation_steps_for` / :func:`effective_batch`: a DDP config's batch arithmetic;
- :func:`scale_table`, :func:`source_check`: 7B / 70B; :func:`dp_threshold`: where reduces hide.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd
import torch
import torch.distributed as dist
from torch import nn

from course_lib import kit, validate
from course_lib.measure.bucket_sweep import torch_ddp_buckets
from course_lib.parallel import harness as H
from course_lib.runtime.launch import launch
from course_lib.techniques.accumulation import effective_batch
from course_lib.units.u09_data_parallelism._setup import batch_fn, model_fn
from course_lib.units.u09_data_parallelism.run_buckets import (
    BucketSweep,
    ddp_bucket_sweep,
    summarize_sweep,
)
from course_lib.units.u09_data_parallelism.run_efficiency import dp_threshold, scaling_efficiency
from course_lib.units.u09_data_parallelism.run_scale import (  # noqa: F401 (re-exported)
    accumulation_steps_for,
    scale_table,
    source_check,
)
from course_lib.units.u09_data_parallelism.run_traffic import (
    accumulation_traffic,
    bytes_per_step,
)

__all__ = [
    "scaling_efficiency",
    "dp_threshold",
    "SOURCE_GRADS",
    "model_fn",
    "batch_fn",
    "worked_example",
    "parity",
    "bucket_assignment",
    "bytes_per_step",
    "BucketSweep",
    "ddp_bucket_sweep",
    "accumulation_traffic",
    "straggler",
    "effective_batch",
    "accumulation_steps_for",
    "scale_table",
    "source_check",
    "summarize_sweep",
    "median_step",
]

#: the gradients of the sources' worked example (S1), one per rank
SOURCE_GRADS = (0.20, 0.10, -0.05, 0.15)


# --------------------------------------------------------------------------------------------
# the worked example: 4 ranks, 4 gradients, one average
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ExampleRow:
    """One rank of :func:`worked_example`."""

    rank: int
    local_grad: float
    averaged_grad: float
    update: float


def _example_worker(
    rank: int, world_size: int, grads: Sequence[float], lr: float, w0: float
) -> ExampleRow:
    from course_lib.parallel.ddp import DataParallel

    linear = nn.Linear(1, 1, bias=False).double()
    model = DataParallel(linear, bucket_cap_mb=25.0)  # exact
    with torch.no_grad():
        linear.weight.fill_(w0)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    # loss = g_r * w: its gradient on rank r is exactly the source's g_r
    (grads[rank] * linear.weight.sum()).backward()
    grad = linear.weight.grad
    assert grad is not None  # backward just filled it
    averaged = grad.item()
    opt.step()
    return ExampleRow(rank, grads[rank], averaged, linear.weight.item() - w0)


def worked_example(
    grads: Sequence[float] = SOURCE_GRADS, *, lr: float = 1e-3, w0: float = 1.0
) -> pd.DataFrame:
    """One rank per gradient: each computes its own gradient (loss g_r * w), DataParallel
    all-reduces the mean, SGD steps with ``lr``. One row per rank: local_grad, averaged_grad,
    update (parameter after - before: -lr x mean)."""
    grads = [validate.number(f"grads[{i}]", g) for i, g in enumerate(grads)]
    if not 1 <= len(grads) <= 8:
        raise ValueError(f"grads = {grads!r}: expected 1 to 8 gradients (one rank each)")
    lr = validate.number("lr", lr, positive=True)
    w0 = validate.number("w0", w0)
    return kit.frame(launch(_example_worker, len(grads), grads, lr, w0), ExampleRow)


# --------------------------------------------------------------------------------------------
# parity and buckets
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ParityRow:
    """One world size of :func:`parity`."""

    world_size: int
    comparisons: int
    failed: int
    worst: float
    ok: bool


def _parity_worker(rank: int, world_size: int, cap: float, steps: int, naive: bool) -> H.Record:
    from course_lib.parallel.ddp import DataParallel, allreduce_gradients, broadcast_parameters

    opt_fn = H.make_optimizer_fn("adamw", lr=1e-2)
    if naive:  # the naive version: broadcast once, all-reduce every gradient after backward
        model = model_fn(seed=rank)  # rank 0 builds the reference's model; the others differ
        broadcast_parameters(model)

        def step_fn(m: nn.Module, batch: H.Batch) -> torch.Tensor:
            loss = H.mse_loss(m, batch)
            loss.backward()
            allreduce_gradients(m)
            return loss

        return H.parallel_run(
            model,
            batch_fn,
            steps=steps,
            optimizer_fn=opt_fn,
            step_fn=step_fn,
            shard=(rank, world_size),
        )
    # each rank builds a different model on purpose: the broadcast must make them one
    model = DataParallel(model_fn(seed=rank), bucket_cap_mb=cap)
    return H.parallel_run(
        model, batch_fn, steps=steps, optimizer_fn=opt_fn, shard=(rank, world_size)
    )


def parity(
    world_sizes: Sequence[int] = (1, 2, 3, 4),
    *,
    steps: int = 3,
    bucket_cap_mb: float = 0.001,
    naive: bool = False,
) -> pd.DataFrame:
    """``steps`` AdamW steps (lr 1e-2, float64) of :func:`model_fn` under DataParallel (or the
    naive version, ``naive=True``) on each world size, against one process on the full batch.
    One row per world size: comparisons (losses, gradients, parameters, every rank and step),
    failed, worst (max over comparisons of |difference| / tolerance; the harness tolerance is
    rtol 1e-5 x max|reference| + atol 1e-6 per tensor), ok."""
    sizes = validate.counts("world_sizes", world_sizes, minimum=1)
    steps = validate.count("steps", steps, minimum=1)
    cap = validate.number("bucket_cap_mb", bucket_cap_mb, positive=True)
    reference = H.reference_run(
        model_fn, batch_fn, steps=steps, optimizer_fn=H.make_optimizer_fn("adamw", lr=1e-2)
    )
    rows = []
    for n in sizes:
        table = H.compare(reference, launch(_parity_worker, n, cap, steps, bool(naive)))
        worst = float((table.max_abs_diff / table.tolerance).max())
        rows.append(ParityRow(n, len(table), int((~table.ok).sum()), worst, bool(table.ok.all())))
    return kit.frame(rows, ParityRow)


@dataclass(frozen=True)
class BucketRow:
    """One cap of :func:`bucket_assignment`: the parameter names per bucket, ours and torch's."""

    bucket_cap_mb: float
    cap_bytes: int
    n_buckets: int
    course: list[list[str]]
    torch: list[list[str]]
    equal: bool


def _bucket_worker(
    rank: int, world_size: int, caps: list[float]
) -> dict[float, dict[str, list[list[str]]]]:
    from course_lib.parallel.ddp import DataParallel

    example = torch.randn(2, 8, dtype=torch.float64)
    return {
        cap: {
            "course": DataParallel(model_fn(), bucket_cap_mb=cap).buckets,
            "torch": torch_ddp_buckets(model_fn(), cap, example),
        }
        for cap in caps
    }


def bucket_assignment(
    bucket_caps_mb: Sequence[float] = (0.0002, 0.001, 0.005, 25), *, world_size: int = 2
) -> pd.DataFrame:
    """Buckets of :func:`model_fn` under our DataParallel and torch's DDP (read from its logging
    data after it rebuilt them), per cap. One row per cap: bucket_cap_mb, cap_bytes, n_buckets,
    course (names per bucket), torch (same), equal."""
    caps = [validate.number("bucket_caps_mb[i]", c, positive=True) for c in bucket_caps_mb]
    n = validate.count("world_size", world_size, minimum=1)
    res = launch(_bucket_worker, n, caps)[0]
    return kit.frame(
        [
            BucketRow(c, int(c * 2**20), len(ours), ours, res[c]["torch"], ours == res[c]["torch"])
            for c in caps
            for ours in [res[c]["course"]]
        ],
        BucketRow,
    )


# --------------------------------------------------------------------------------------------
# a straggler
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class StragglerRow:
    """One rank and step of :func:`straggler` (seconds)."""

    rank: int
    step: int
    slow: bool
    compute_s: float
    step_s: float


def _straggler_worker(
    rank: int, world_size: int, slow_rank: int, delay_s: float, steps: int
) -> list[StragglerRow]:
    from course_lib.parallel.ddp import DataParallel

    model = DataParallel(model_fn(width=64, dtype=torch.float32), bucket_cap_mb=25.0)
    x, y = H.shard_batch(batch_fn(0, rows=32, dtype=torch.float32), rank, world_size)
    rows = []
    for step in range(steps + 1):  # step 0 warms up
        dist.barrier()
        t0 = time.perf_counter()
        loss = H.mse_loss(model, (x, y))
        if rank == slow_rank and delay_s:
            time.sleep(delay_s)  # a slower GPU, a noisy neighbour, a longer batch
        t_compute = time.perf_counter()
        loss.backward()  # the all-reduce inside waits for the slowest rank
        t1 = time.perf_counter()
        if step:
            rows.append(StragglerRow(rank, step, rank == slow_rank, t_compute - t0, t1 - t0))
    return rows


def straggler(
    *, world_size: int = 4, slow_rank: int = 3, delay_s: float = 0.2, steps: int = 3
) -> pd.DataFrame:
    """DataParallel steps on ``world_size`` ranks where rank ``slow_rank`` sleeps ``delay_s``
    seconds before backward. One row per rank and step: compute_s (forward, plus the sleep on
    the slow rank), step_s (until backward, with its all-reduce, returned). Seconds; absolute
    values are this machine's and are never graded."""
    n = validate.count("world_size", world_size, minimum=2)
    slow = validate.count("slow_rank", slow_rank, minimum=0, maximum=n - 1)
    delay = validate.number("delay_s", delay_s, minimum=0, maximum=5)
    steps = validate.count("steps", steps, minimum=1)
    res = launch(_straggler_worker, n, slow, delay, steps)
    return kit.frame(kit.rows_of(res, StragglerRow), StragglerRow)


def median_step(df: pd.DataFrame) -> pd.DataFrame:
    """Median over steps of :func:`straggler`'s times, per rank (seconds)."""
    return df.groupby(["rank", "slow"], as_index=False)[["compute_s", "step_s"]].agg(
        statistics.median
    )
