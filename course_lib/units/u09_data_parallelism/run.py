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

import contextlib
import statistics
import time
from collections.abc import Sequence

import pandas as pd
import torch
import torch.distributed as dist
from torch import nn

from course_lib import validate
from course_lib.measure import estimate
from course_lib.measure.bucket_sweep import torch_ddp_buckets
from course_lib.parallel import harness as H
from course_lib.runtime.launch import launch
from course_lib.techniques.accumulation import effective_batch
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


def model_fn(seed: int = 0, *, width: int = 32, dtype: torch.dtype = torch.float64) -> nn.Module:
    """The parity model: MLP 8 -> width -> width/2 -> 2 (float64 by default: Adam magnifies the
    rounding noise of near-zero gradients, see parallel/harness/compare.py)."""
    from course_lib.models import MLP, MLPConfig

    torch.manual_seed(seed)
    return MLP(MLPConfig(in_features=8, hidden=(width, width // 2), out_features=2)).to(dtype)


def batch_fn(step: int, *, rows: int = 24, dtype: torch.dtype = torch.float64):
    """The full batch of step ``step`` (a regression task; 24 rows: divisible by 1, 2, 3, 4)."""
    from course_lib.data import regression_task

    x, y = regression_task(rows, 8, 2, seed=step)
    return x.to(dtype), y.to(dtype)


def _n_bytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


# --------------------------------------------------------------------------------------------
# the worked example: 4 ranks, 4 gradients, one average
# --------------------------------------------------------------------------------------------
def _example_worker(rank: int, world_size: int, grads, lr: float, w0: float) -> dict:
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
    return {
        "rank": rank,
        "local_grad": grads[rank],
        "averaged_grad": averaged,
        "update": linear.weight.item() - w0,
    }


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
    return pd.DataFrame(launch(_example_worker, len(grads), grads, lr, w0))


# --------------------------------------------------------------------------------------------
# parity and buckets
# --------------------------------------------------------------------------------------------
def _parity_worker(rank: int, world_size: int, cap: float, steps: int, naive: bool) -> H.Record:
    from course_lib.parallel.ddp import DataParallel, allreduce_gradients, broadcast_parameters

    opt_fn = H.make_optimizer_fn("adamw", lr=1e-2)
    if naive:  # the naive version: broadcast once, all-reduce every gradient after backward
        model = model_fn(seed=rank)  # rank 0 builds the reference's model; the others differ
        broadcast_parameters(model)

        def step_fn(m, batch):
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
        rows.append(
            {
                "world_size": n,
                "comparisons": len(table),
                "failed": int((~table.ok).sum()),
                "worst": float((table.max_abs_diff / table.tolerance).max()),
                "ok": bool(table.ok.all()),
            }
        )
    return pd.DataFrame(rows)


def _bucket_worker(rank: int, world_size: int, caps: list[float]) -> dict:
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
    return pd.DataFrame(
        [
            {
                "bucket_cap_mb": c,
                "cap_bytes": int(c * 2**20),
                "n_buckets": len(res[c]["course"]),
                "course": res[c]["course"],
                "torch": res[c]["torch"],
                "equal": res[c]["course"] == res[c]["torch"],
            }
            for c in caps
        ]
    )


# --------------------------------------------------------------------------------------------
# bytes per step
# --------------------------------------------------------------------------------------------
def _bytes_worker(rank: int, world_size: int, width: int, cap: float) -> list[dict]:
    from course_lib.measure.comm import CommMeter
    from course_lib.parallel.ddp import DataParallel, allreduce_gradients

    rows = []
    x, y = H.shard_batch(batch_fn(0, dtype=torch.float32), rank, world_size)
    for version in ("naive", "bucketed"):
        plain = model_fn(width=width, dtype=torch.float32)
        model = DataParallel(plain, bucket_cap_mb=cap) if version == "bucketed" else plain
        loss = H.mse_loss(model, (x, y))
        with CommMeter(dispatch=False) as meter:
            loss.backward()  # the bucketed version all-reduces in here
            if version == "naive":
                allreduce_gradients(plain)
        rows.append(
            {
                "world_size": world_size,
                "rank": rank,
                "version": version,
                "all_reduce_calls": meter.calls.get("all_reduce", 0),
                "grad_bytes": _n_bytes(plain),
                "model_bytes": meter.model_bytes_sent,
                "wire_bytes": meter.wire_bytes_sent,
                "wire_source": meter.wire_source,
            }
        )
    return rows


def bytes_per_step(
    world_sizes: Sequence[int] = (2, 4), *, width: int = 256, bucket_cap_mb: float = 0.25
) -> pd.DataFrame:
    """One backward + gradient all-reduce of :func:`model_fn` (float32, ``width``) per world
    size, naive and bucketed, measured by CommMeter in every rank. One row per world size,
    rank and version: all_reduce_calls, grad_bytes (Psi x 4 B), predicted (2(N-1)/N x
    grad_bytes, ``estimate.ring_allreduce_bytes_sent``), model_bytes (CommMeter's ring figure
    per call, summed), wire_bytes (MEASURED: what the rank wrote to its sockets, /proc/self/io
    wchar; None where the OS cannot see it), residual (wire - predicted: gloo's headers)."""
    sizes = validate.counts("world_sizes", world_sizes, minimum=2)
    width = validate.count("width", width, minimum=2)
    cap = validate.number("bucket_cap_mb", bucket_cap_mb, positive=True)
    rows = [row for n in sizes for res in launch(_bytes_worker, n, width, cap) for row in res]
    df = pd.DataFrame(rows)
    df["predicted"] = [
        estimate.ring_allreduce_bytes_sent(g, n) for g, n in zip(df.grad_bytes, df.world_size)
    ]
    df["residual"] = [None if w is None else w - p for w, p in zip(df.wire_bytes, df.predicted)]
    return df


# --------------------------------------------------------------------------------------------
# gradient accumulation with and without no_sync
# --------------------------------------------------------------------------------------------
def _accumulation_worker(rank: int, world_size: int, micro_steps: int, cap: float) -> list[dict]:
    from course_lib.measure.comm import CommMeter
    from course_lib.parallel.ddp import DataParallel

    x, y = H.shard_batch(batch_fn(0, rows=8 * world_size * micro_steps), rank, world_size)
    reference = H.reference_run(model_fn, lambda s: batch_fn(0, rows=8 * world_size * micro_steps))
    rows = []
    for use_no_sync in (False, True):
        model = DataParallel(model_fn(), bucket_cap_mb=cap)
        with CommMeter(dispatch=False) as meter:
            for k, (xm, ym) in enumerate(zip(x.chunk(micro_steps), y.chunk(micro_steps))):
                last = k == micro_steps - 1
                quiet = model.no_sync() if use_no_sync and not last else contextlib.nullcontext()
                with quiet:
                    (H.mse_loss(model, (xm, ym)) / micro_steps).backward()
        grads = H.full_tensors(model, "grad")
        err = max(float((grads[n] - g).abs().max()) for n, g in reference.grads[0].items())
        rows.append(
            {
                "rank": rank,
                "no_sync": use_no_sync,
                "micro_steps": micro_steps,
                "buckets": len(model.buckets),
                "all_reduce_calls": meter.calls.get("all_reduce", 0),
                "model_bytes": meter.model_bytes_sent,
                "wire_bytes": meter.wire_bytes_sent,
                "grad_max_abs_err": err,
            }
        )
    return rows


def accumulation_traffic(
    *, world_size: int = 2, micro_steps: int = 4, bucket_cap_mb: float = 0.001
) -> pd.DataFrame:
    """One optimizer step made of ``micro_steps`` micro-batches of 8 rows per rank, with every
    micro-step all-reduced (no_sync False) and with ``no_sync`` on all but the last. One row
    per rank and mode: all_reduce_calls, model_bytes, wire_bytes (measured), grad_max_abs_err
    (against one process on the whole batch: both modes train the same model)."""
    n = validate.count("world_size", world_size, minimum=2)
    k = validate.count("micro_steps", micro_steps, minimum=1)
    cap = validate.number("bucket_cap_mb", bucket_cap_mb, positive=True)
    return pd.DataFrame([r for res in launch(_accumulation_worker, n, k, cap) for r in res])


# --------------------------------------------------------------------------------------------
# a straggler
# --------------------------------------------------------------------------------------------
def _straggler_worker(
    rank: int, world_size: int, slow_rank: int, delay_s: float, steps: int
) -> list[dict]:
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
            rows.append(
                {
                    "rank": rank,
                    "step": step,
                    "slow": rank == slow_rank,
                    "compute_s": t_compute - t0,
                    "step_s": t1 - t0,
                }
            )
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
    return pd.DataFrame(
        [r for res in launch(_straggler_worker, n, slow, delay, steps) for r in res]
    )


def median_step(df: pd.DataFrame) -> pd.DataFrame:
    """Median over steps of :func:`straggler`'s times, per rank (seconds)."""
    return df.groupby(["rank", "slow"], as_index=False)[["compute_s", "step_s"]].agg(
        statistics.median
    )
