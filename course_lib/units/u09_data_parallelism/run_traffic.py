"""Unit 09, what data parallelism puts on the wire: gradient all-reduce bytes per step, naive and
bucketed, and gradient accumulation with and without ``no_sync``, measured by CommMeter in every
rank. Used by notebooks/09_data_parallelism.ipynb through :mod:`run` (which re-exports these names).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd
import torch

from course_lib import kit, validate
from course_lib.measure import estimate
from course_lib.parallel import harness as H
from course_lib.runtime.launch import launch
from course_lib.units.u09_data_parallelism._setup import _n_bytes, batch_fn, model_fn


# --------------------------------------------------------------------------------------------
# bytes per step
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BytesRow:
    """One rank and version of :func:`bytes_per_step`."""

    world_size: int
    rank: int
    version: str
    all_reduce_calls: int
    grad_bytes: int
    model_bytes: float
    wire_bytes: int | None
    wire_source: str
    predicted: float
    residual: float | None


def _bytes_worker(rank: int, world_size: int, width: int, cap: float) -> list[BytesRow]:
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
        grads, wire = _n_bytes(plain), meter.wire_bytes_sent
        predicted = estimate.ring_allreduce_bytes_sent(grads, world_size)
        rows.append(
            BytesRow(
                world_size=world_size,
                rank=rank,
                version=version,
                all_reduce_calls=meter.calls.get("all_reduce", 0),
                grad_bytes=grads,
                model_bytes=meter.model_bytes_sent,
                wire_bytes=wire,
                wire_source=meter.wire_source,
                predicted=predicted,
                residual=None if wire is None else wire - predicted,
            )
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
    runs = [launch(_bytes_worker, n, width, cap) for n in sizes]
    return kit.frame(kit.rows_of(runs, BytesRow), BytesRow)


# --------------------------------------------------------------------------------------------
# gradient accumulation with and without no_sync
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class AccumulationRow:
    """One rank and mode of :func:`accumulation_traffic`."""

    rank: int
    no_sync: bool
    micro_steps: int
    buckets: int
    all_reduce_calls: int
    model_bytes: float
    wire_bytes: int | None
    grad_max_abs_err: float


def _accumulation_worker(
    rank: int, world_size: int, micro_steps: int, cap: float
) -> list[AccumulationRow]:
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
            AccumulationRow(
                rank=rank,
                no_sync=use_no_sync,
                micro_steps=micro_steps,
                buckets=len(model.buckets),
                all_reduce_calls=meter.calls.get("all_reduce", 0),
                model_bytes=meter.model_bytes_sent,
                wire_bytes=meter.wire_bytes_sent,
                grad_max_abs_err=err,
            )
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
    res = launch(_accumulation_worker, n, k, cap)
    return kit.frame(kit.rows_of(res, AccumulationRow), AccumulationRow)
