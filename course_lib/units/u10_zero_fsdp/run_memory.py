"""Unit 10, memory per rank and bytes on the wire per step, stage by stage.

Used by notebooks/10_zero_fsdp.ipynb through :mod:`run` (which re-exports these names).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pandas as pd
import torch

from course_lib import kit, validate
from course_lib.measure import estimate
from course_lib.parallel import harness as H
from course_lib.runtime.launch import launch
from course_lib.units.u10_zero_fsdp._setup import (
    LR,
    _memory_batch,
    _memory_model,
    units_of,
)

if TYPE_CHECKING:
    from course_lib.measure.comm import CommMeter


# --------------------------------------------------------------------------------------------
# memory per rank
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MemoryRow:
    """One rank and stage of :func:`memory_table` (bytes)."""

    world_size: int
    rank: int
    stage: int
    params: int
    grads: int
    optimizer: int
    total: int
    predicted: float
    padding: float
    paper: float
    residual: float


def _memory_worker(rank: int, world_size: int, stages: Sequence[int]) -> list[MemoryRow]:
    from course_lib.measure.memory import MemoryMeter
    from course_lib.parallel.zero import ZeroDataParallel

    units = units_of(_memory_model())
    psi = sum(map(sum, units))
    rows = []
    for stage in stages:
        model = ZeroDataParallel(_memory_model(), stage=stage, lr=LR)
        batch = H.shard_batch(_memory_batch(0), rank, world_size)
        H.mse_loss(model, batch).backward()
        model.step()
        with MemoryMeter(model, model.optimizer) as after:  # what stays between steps
            pass
        bd = after.start_breakdown
        total = bd["params"] + bd["grads"] + bd["optimizer"]
        pred = estimate.zero_layout_bytes_per_rank(units, stage=stage, world_size=world_size)
        paper = estimate.zero_bytes_per_rank(
            psi, stage=stage, world_size=world_size, k=8, param_bytes=4, grad_bytes=4
        )
        rows.append(
            MemoryRow(
                world_size=world_size,
                rank=rank,
                stage=stage,
                params=bd["params"],
                grads=bd["grads"],
                optimizer=bd["optimizer"],
                total=total,
                predicted=pred["total"],
                padding=pred["padding"],
                paper=paper,
                residual=total - pred["total"],
            )
        )
    return rows


def memory_table(
    world_sizes: Sequence[int] = (1, 2, 4), stages: Sequence[int] = (0, 1, 2, 3)
) -> pd.DataFrame:
    """One AdamW step (float32) of the memory model under each stage, per world size; model
    state MEASURED inside every rank by MemoryMeter after the step (before zero_grad): params,
    grads, optimizer, total. Beside them: predicted (``estimate.
    zero_layout_bytes_per_rank``: our padded layout, exact), padding (its part of predicted),
    paper (``estimate.zero_state_breakdown_per_rank`` with 4-byte params and grads and k = 8,
    no padding and no step counters) and residual (measured - predicted)."""
    sizes = validate.counts("world_sizes", world_sizes, minimum=1)
    stages = [validate.choice("stages[i]", s, (0, 1, 2, 3)) for s in stages]
    runs = [launch(_memory_worker, n, stages) for n in sizes]
    return kit.frame(kit.rows_of(runs, MemoryRow), MemoryRow)


# --------------------------------------------------------------------------------------------
# bytes on the wire per step
# --------------------------------------------------------------------------------------------
def _metered_steps(step: Callable[[], None], zero_grad: Callable[[], None]) -> Any:
    """CommMeter over the second of two training steps (the first warms up: gloo connects,
    first-call warnings); ``step()`` runs forward, backward and the optimizer step."""
    from course_lib.measure.comm import CommMeter

    for _step in range(2):
        with CommMeter(dispatch=False) as meter:
            step()
        zero_grad()
    return meter


@dataclass(frozen=True)
class CommRow:
    """One rank and configuration of :func:`comm_table` (bytes of one step)."""

    world_size: int
    rank: int
    config: str
    stage: int
    reshard_after_forward: bool
    calls: dict[str, int]
    wire_bytes: int | None
    model_bytes: float
    wire_source: str
    predicted: float
    vs_ddp: float | None
    residual: float | None


def _comm_row(
    rank: int, world_size: int, name: str, stage: int, reshard: bool, meter: CommMeter
) -> CommRow:
    units = units_of(_memory_model())
    psi = sum(map(sum, units))
    padded = psi + (estimate.zero_padding(units, world_size) if stage else 0)
    predicted = estimate.zero_bytes_sent_per_step(
        4 * padded, world_size, stage=stage, reshard_after_forward=reshard
    )
    ddp = estimate.ring_allreduce_bytes_sent(4 * psi, world_size)
    wire = meter.wire_bytes_sent
    return CommRow(
        world_size=world_size,
        rank=rank,
        config=name,
        stage=stage,
        reshard_after_forward=reshard,
        calls=dict(meter.calls),
        wire_bytes=wire,
        model_bytes=meter.model_bytes_sent,
        wire_source=meter.wire_source,
        predicted=predicted,
        vs_ddp=None if wire is None else wire / ddp,
        residual=None if wire is None else wire - predicted,
    )


def _comm_worker(
    rank: int, world_size: int, stages: Sequence[int], with_torch: bool
) -> list[CommRow]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from course_lib.parallel.zero import ZeroDataParallel

    batch = H.shard_batch(_memory_batch(0), rank, world_size)
    configs: list[tuple[str, int, dict[str, Any]]] = [(f"stage {s}", s, {}) for s in stages]
    if 3 in stages:
        configs.append(("stage 3, keep after forward", 3, {"reshard_after_forward": False}))
    rows = []
    for name, stage, kw in configs:
        model = ZeroDataParallel(_memory_model(), stage=stage, lr=LR, **kw)

        def zero_step(model: ZeroDataParallel = model) -> None:
            H.mse_loss(model, batch).backward()
            model.step()

        meter = _metered_steps(zero_step, model.zero_grad)
        reshard = kw.get("reshard_after_forward", True)
        rows.append(_comm_row(rank, world_size, name, stage, reshard, meter))
    if with_torch:
        fsdp = _memory_model()
        # a CPU mesh, as the model and its batches are on the CPU: without one, FSDP2 builds its
        # mesh on the machine's GPU whatever the backend ("invalid device ordinal" on rank 1)
        mesh = init_device_mesh("cpu", (world_size,))
        for layer in fsdp.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(fsdp, mesh=mesh)
        opt = torch.optim.AdamW(fsdp.parameters(), lr=LR)

        def fsdp_step() -> None:
            H.mse_loss(fsdp, batch).backward()
            opt.step()

        meter = _metered_steps(fsdp_step, opt.zero_grad)
        rows.append(_comm_row(rank, world_size, "torch fully_shard", 3, True, meter))
    return rows


def comm_table(
    world_sizes: Sequence[int] = (2, 4),
    stages: Sequence[int] = (0, 1, 2, 3),
    *,
    with_torch: bool = True,
) -> pd.DataFrame:
    """Bytes each rank wrote to its sockets during one training step (forward, backward,
    ``step()``; MEASURED by CommMeter from /proc/self/io, gloo), per world size and
    configuration; stage 3 also with ``reshard_after_forward=False``, and torch's
    ``fully_shard`` (``with_torch``). Beside: predicted (``estimate.zero_bytes_sent_per_step``
    on the padded float32 size; DDP's all-reduce for stage 0), vs_ddp (measured / the ring
    all-reduce of the unpadded gradients), residual (measured - predicted: gloo's headers)."""
    sizes = validate.counts("world_sizes", world_sizes, minimum=2)
    stages = [validate.choice("stages[i]", s, (0, 1, 2, 3)) for s in stages]
    runs = [launch(_comm_worker, n, stages, bool(with_torch)) for n in sizes]
    return kit.frame(kit.rows_of(runs, CommRow), CommRow)
