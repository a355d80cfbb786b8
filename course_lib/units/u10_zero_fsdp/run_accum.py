"""Unit 10, bytes on the wire per optimizer step with K micro-batches accumulated.

DDP with ``no_sync`` (the course's ``parallel.ddp.DataParallel``), ZeRO stages 1, 2 and 3 (the
course's ``parallel.zero.ZeroDataParallel``), each running K forward/backward passes and one
optimizer step; CommMeter measures what every rank wrote to its sockets. Used by
notebooks/10_zero_fsdp.ipynb through :mod:`run` (which re-exports these names).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pandas as pd

from course_lib import kit, validate
from course_lib.measure import estimate
from course_lib.parallel import harness as H
from course_lib.runtime.launch import launch
from course_lib.units.u10_zero_fsdp._setup import LR, _memory_batch, _memory_model, units_of


@dataclass(frozen=True)
class AccumRow:
    """One rank, configuration and K of :func:`accumulation_comm_table` (bytes of one step)."""

    world_size: int
    rank: int
    config: str
    stage: int
    K: int
    calls: int
    wire_bytes: int | None
    payload_bytes: float
    wire_source: str
    predicted: float
    residual: float | None
    vs_ddp: float | None


if TYPE_CHECKING:
    from torch import nn

#: what :func:`accumulation_comm_table` runs: name -> ZeRO stage (0: DDP with no_sync)
ACCUM_CONFIGS = {"DDP, no_sync": 0, "stage 1": 1, "stage 2": 2, "stage 3": 3}


def _make(
    config: str,
) -> tuple[
    nn.Module, Callable[[], Any], Callable[..., Any], Callable[[], AbstractContextManager[Any]]
]:
    """(model, optimizer step, zero_grad, context of the K - 1 silent micro-batches)."""
    import torch

    from course_lib.parallel.ddp import DataParallel
    from course_lib.parallel.zero import ZeroDataParallel

    stage = ACCUM_CONFIGS[config]
    if stage == 0:
        ddp = DataParallel(_memory_model())  # one bucket (136 kB < 25 MiB): one all-reduce
        opt = torch.optim.AdamW(ddp.parameters(), lr=LR)
        return ddp, opt.step, opt.zero_grad, ddp.no_sync
    zero = ZeroDataParallel(_memory_model(), stage=stage, lr=LR)
    return zero, zero.step, zero.zero_grad, nullcontext


def _accum_worker(
    rank: int, world_size: int, configs: Sequence[str], ks: Sequence[int]
) -> list[AccumRow]:
    from course_lib.measure.comm import CommMeter

    units = units_of(_memory_model())
    psi = sum(map(sum, units))
    padded = psi + estimate.zero_padding(units, world_size)
    ddp = estimate.zero_bytes_sent_per_step(4 * psi, world_size, stage=0)
    rows = []
    for config in configs:
        model, step, zero_grad, silent = _make(config)
        for k in ks:
            for _warm_up in range(2):  # the second optimizer step is the one kept
                with CommMeter(dispatch=False) as meter:
                    for j in range(k):  # K micro-batches, then one optimizer step
                        batch = H.shard_batch(_memory_batch(j), rank, world_size)
                        with silent() if j < k - 1 else nullcontext():
                            H.mse_loss(model, batch).backward()
                    step()
                zero_grad()
            s, wire = ACCUM_CONFIGS[config], meter.wire_bytes_sent
            predicted = estimate.zero_bytes_sent_per_step(
                4 * (padded if s else psi), world_size, stage=s, micro_batches=k
            )
            rows.append(
                AccumRow(
                    world_size=world_size,
                    rank=rank,
                    config=config,
                    stage=s,
                    K=k,
                    calls=sum(meter.calls.values()),
                    wire_bytes=wire,
                    payload_bytes=meter.model_bytes_sent,
                    wire_source=meter.wire_source,
                    predicted=predicted,
                    residual=None if wire is None else wire - predicted,
                    vs_ddp=None if wire is None else wire / ddp,
                )
            )
    return rows


def accumulation_comm_table(
    micro_batches: Sequence[int] = (1, 2, 4),
    *,
    world_size: int = 4,
    configs: Sequence[str] = tuple(ACCUM_CONFIGS),
) -> pd.DataFrame:
    """Bytes each rank wrote to its sockets during one optimizer step of K micro-batches
    (MEASURED by CommMeter from /proc/self/io, gloo; the second of two steps), for each
    configuration of :data:`ACCUM_CONFIGS` (float32 memory model, Psi = 34,003) and each K in
    ``micro_batches``. One row per rank, configuration and K: calls, wire_bytes (measured),
    payload_bytes (CommMeter's ring model of the calls really made), predicted
    (``estimate.zero_bytes_sent_per_step(S, N, stage=..., micro_batches=K)``, S the padded
    float32 size; DDP: the unpadded one), residual (measured - predicted: gloo's headers),
    vs_ddp (measured / DDP's predicted bytes)."""
    ks = validate.counts("micro_batches", micro_batches, minimum=1)
    n = validate.count("world_size", world_size, minimum=2)
    configs = validate.choices("configs", configs, tuple(ACCUM_CONFIGS))
    res = launch(_accum_worker, n, configs, ks)
    return kit.frame(kit.rows_of(res, AccumRow), AccumRow)
