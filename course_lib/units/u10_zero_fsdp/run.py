"""Unit 10's measured runs (notebooks/10_zero_fsdp.ipynb): ZeRO stages 0-3 on real ranks.

Every multi-rank run goes through ``course_lib.launch`` (gloo on CPU; NCCL with one GPU per rank)
and uses the course's from-scratch ``parallel.zero.ZeroDataParallel`` beside PyTorch's
``ZeroRedundancyOptimizer`` and FSDP2 ``fully_shard``. Each function returns a tidy DataFrame:

- :func:`parity`: 3 AdamW steps of every stage on 2-4 ranks against one process (harness);
- :func:`torch_parity`: ours beside ZeroRedundancyOptimizer (stage 1) and ``fully_shard``
  (reshard_after_forward False ~ stage 2, True ~ stage 3), losses step by step;
- :func:`memory_table`: parameters, gradients, optimizer state per rank measured by MemoryMeter
  inside the ranks, beside ``estimate.zero_layout_bytes_per_rank`` and the paper's formula;
- :func:`comm_table`: bytes each rank wrote to its sockets per step, beside
  ``estimate.zero_bytes_sent_per_step``;
- :func:`accumulation_comm_table`: the same with K micro-batches per optimizer step, DDP with
  ``no_sync`` beside stages 1-3;
- :func:`hybrid_table`: ZeRO-3, HSDP and ZeRO++ on 2 "nodes" x 2 ranks, intra- and
  inter-node bytes measured beside :func:`hybrid_formula`; :func:`hybrid_at_scale` at 70B;
- :func:`fsdp_timeline`: stage 3's per-rank Gantt chart with and without prefetch, and
  reshard-after-forward on and off (peak memory and bytes measured);
- :func:`scale_grid`, :func:`source_checks`, :func:`smallest_stage`: 7B-70B through estimate;
- :func:`fsdp_threshold` (``run_threshold.py``): where the prefetched all-gather hides, measured.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch

from course_lib import kit, validate
from course_lib.parallel import harness as H
from course_lib.runtime.launch import launch
from course_lib.units.u10_zero_fsdp._setup import (  # noqa: F401 (_memory_model: the notebooks)
    LR,
    _adamw,
    _memory_model,
    _self,
    _summary,
    _zero_full_tensors,
    batch_fn,
    model_fn,
    units_of,
)
from course_lib.units.u10_zero_fsdp.run_accum import (
    ACCUM_CONFIGS,
    accumulation_comm_table,
)
from course_lib.units.u10_zero_fsdp.run_hybrid import (
    hybrid_at_scale,
    hybrid_formula,
    hybrid_table,
)
from course_lib.units.u10_zero_fsdp.run_memory import (
    comm_table,
    memory_table,
)
from course_lib.units.u10_zero_fsdp.run_scale import (
    scale_grid,
    smallest_stage,
    source_checks,
)
from course_lib.units.u10_zero_fsdp.run_threshold import fsdp_threshold

__all__ = [
    "model_fn",
    "batch_fn",
    "units_of",
    "parity",
    "torch_parity",
    "memory_table",
    "comm_table",
    "accumulation_comm_table",
    "ACCUM_CONFIGS",
    "hybrid_table",
    "hybrid_formula",
    "hybrid_at_scale",
    "fsdp_timeline",
    "scale_grid",
    "source_checks",
    "smallest_stage",
    "fsdp_threshold",
]

# --------------------------------------------------------------------------------------------
# parity: our stages against one process, and against PyTorch's own
# --------------------------------------------------------------------------------------------
_VARIANTS: dict[str, dict[str, Any]] = {
    "": {},
    "prefetch": {"prefetch": True},
    "keep after forward": {"reshard_after_forward": False},
}


@dataclass(frozen=True)
class ParityRow:
    """One world size, stage and variant of :func:`parity`."""

    world_size: int
    stage: int
    variant: str
    comparisons: int
    failed: int
    worst: float
    ok: bool


def _parity_worker(rank: int, world_size: int, stages, variants, steps: int) -> dict:
    from course_lib.parallel.zero import ZeroDataParallel

    out = {}
    for stage in stages:
        for variant in variants if stage == 3 else [""]:
            # each rank builds a different model: the broadcast must make them one
            model = ZeroDataParallel(model_fn(seed=rank), stage=stage, lr=LR, **_VARIANTS[variant])
            out[(stage, variant)] = H.parallel_run(
                model,
                batch_fn,
                steps=steps,
                optimizer_fn=_self,
                gather_fn=_zero_full_tensors,
                shard=(rank, world_size),
            )
    return out


def parity(
    world_sizes: Sequence[int] = (2, 3, 4),
    stages: Sequence[int] = (1, 2, 3),
    *,
    steps: int = 3,
    variants: Sequence[str] = ("",),
) -> pd.DataFrame:
    """``steps`` AdamW steps (lr 1e-2, float64) under ZeroDataParallel, each stage and world
    size, against one process on the full batch (``parallel.harness``). ``variants`` of stage 3:
    "" (reshard after forward), "prefetch", "keep after forward". One row per world size, stage
    and variant: comparisons, failed, worst (max |difference| / tolerance; tolerance
    1e-6 + 1e-5 x max|reference| per tensor), ok."""
    sizes = validate.counts("world_sizes", world_sizes, minimum=1)
    stages = [validate.choice("stages[i]", s, (0, 1, 2, 3)) for s in stages]
    variants = validate.choices("variants", variants, tuple(_VARIANTS))
    steps = validate.count("steps", steps, minimum=1)
    reference = H.reference_run(model_fn, batch_fn, steps=steps, optimizer_fn=_adamw)
    rows = []
    for n in sizes:
        results = launch(_parity_worker, n, stages, variants, steps)
        for key in results[0]:
            table = H.compare(reference, [r[key] for r in results])
            rows.append(ParityRow(n, key[0], key[1], *_summary(table)))
    return kit.frame(rows, ParityRow)


def _torch_worker(rank: int, world_size: int, steps: int) -> dict:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP

    from course_lib.parallel.zero import ZeroDataParallel, full_tensors

    def run(model, optimizer_fn, gather_fn=H.full_tensors):
        return H.parallel_run(
            model,
            batch_fn,
            steps=steps,
            optimizer_fn=optimizer_fn,
            gather_fn=gather_fn,
            shard=(rank, world_size),
        )

    out = {}
    for stage in (1, 2, 3):
        out[f"ours, stage {stage}"] = run(
            ZeroDataParallel(model_fn(), stage=stage, lr=LR), _self, full_tensors
        )
    out["ZeroRedundancyOptimizer"] = run(
        DDP(model_fn()),
        lambda m: ZeroRedundancyOptimizer(m.parameters(), optimizer_class=torch.optim.AdamW, lr=LR),
    )
    for reshard in (False, True):
        model = model_fn()
        # a CPU mesh, as the model and its batches are on the CPU: without one, FSDP2 builds its
        # mesh on the machine's GPU whatever the backend ("invalid device ordinal" on rank 1)
        mesh = init_device_mesh("cpu", (world_size,))
        for layer in model.layers:
            fully_shard(layer, mesh=mesh, reshard_after_forward=reshard)
        fully_shard(model, mesh=mesh, reshard_after_forward=reshard)
        out[f"fully_shard(reshard_after_forward={reshard})"] = run(model, _adamw)
    dist.barrier()
    return out


#: which of torch's wrappers each of our stages is compared with
TORCH_TWIN = {
    "ours, stage 1": "ZeroRedundancyOptimizer",
    "ours, stage 2": "fully_shard(reshard_after_forward=False)",
    "ours, stage 3": "fully_shard(reshard_after_forward=True)",
}


@dataclass(frozen=True)
class TorchParityRow:
    """One implementation of :func:`torch_parity`; ``twin`` and ``loss_diff`` for ours only."""

    implementation: str
    losses: list[float]
    comparisons: int
    failed: int
    worst: float
    ok: bool
    twin: str | None
    loss_diff: float | None


def torch_parity(*, world_size: int = 2, steps: int = 3) -> pd.DataFrame:
    """Ours and PyTorch's on the same ranks, model and batches (float64, AdamW lr 1e-2). One row
    per implementation: losses (per step), worst and ok against one process (harness
    tolerance), and for ours, twin (torch's counterpart) and loss_diff (max |our loss - its
    loss| over steps)."""
    n = validate.count("world_size", world_size, minimum=1)
    steps = validate.count("steps", steps, minimum=1)
    reference = H.reference_run(model_fn, batch_fn, steps=steps, optimizer_fn=_adamw)
    results = launch(_torch_worker, n, steps)
    rows = []
    for name in results[0]:
        rec = [r[name] for r in results]
        twin = TORCH_TWIN.get(name)
        theirs = [] if twin is None else results[0][twin].losses
        diff = max((abs(a - b) for a, b in zip(rec[0].losses, theirs)), default=None)
        summary = _summary(H.compare(reference, rec))
        rows.append(TorchParityRow(name, rec[0].losses, *summary, twin=twin, loss_diff=diff))
    return kit.frame(rows, TorchParityRow)


# --------------------------------------------------------------------------------------------
# the FSDP timeline
# --------------------------------------------------------------------------------------------
TIMELINE_CONFIGS: dict[str, dict[str, Any]] = {
    "reshard, no prefetch": {"prefetch": False, "reshard_after_forward": True},
    "reshard, prefetch": {"prefetch": True, "reshard_after_forward": True},
    "keep, no prefetch": {"prefetch": False, "reshard_after_forward": False},
    "keep, prefetch": {"prefetch": True, "reshard_after_forward": False},
}


@dataclass(frozen=True)
class TimelineRow:
    """One rank and configuration of :func:`fsdp_timeline`'s summary."""

    rank: int
    config: str
    prefetch: bool
    reshard_after_forward: bool
    peak_bytes: int
    wire_bytes: int | None
    all_gathers: int


def _timeline_worker(
    rank: int, world_size: int, configs, width: int, depth: int, batch: int
) -> dict:
    import torch.distributed as dist

    from course_lib.measure.comm import CommMeter
    from course_lib.measure.memory import MemoryMeter
    from course_lib.measure.timing import EventLog
    from course_lib.parallel.zero import ZeroDataParallel

    x = torch.randn(batch, 8)
    y = torch.randn(batch, 2)
    events, rows = [], []
    for name in configs:
        model = ZeroDataParallel(
            model_fn(width=width, depth=depth, dtype=torch.float32, taper=False),
            stage=3,
            lr=LR,
            **TIMELINE_CONFIGS[name],
        )
        for step in range(3):  # 0: warm-up, 1: peak memory, 2: timeline and bytes
            model.log = EventLog(rank) if step == 2 else None
            mem = MemoryMeter(model, model.optimizer)
            comm = CommMeter(dispatch=False)
            meter: MemoryMeter | CommMeter = mem if step == 1 else comm
            dist.barrier()
            with meter:  # forward and backward: where stage 3 gathers (its step() sends nothing)
                H.mse_loss(model, (x, y)).backward()
            model.step()
            model.zero_grad()
            if step == 1:
                peak = mem.peak_bytes
        log = model.log
        assert log is not None  # step 2 set it
        events += [{**e, "meta": {**e["meta"], "config": name}} for e in log.to_records()]
        gathers = sum(
            comm.calls.get(op, 0) for op in ("all_gather_single", "all_gather_into_tensor")
        )
        wire = comm.wire_bytes_sent  # of the last step
        rows.append(
            TimelineRow(
                rank,
                name,
                **TIMELINE_CONFIGS[name],
                peak_bytes=peak,
                wire_bytes=wire,
                all_gathers=gathers,
            )
        )
    return {"events": events, "rows": rows}


def fsdp_timeline(
    configs: Sequence[str] = tuple(TIMELINE_CONFIGS),
    *,
    world_size: int = 2,
    width: int = 256,
    depth: int = 6,
    batch: int = 64,
):
    """Stage 3 on an MLP of ``depth`` + 1 Linear units (float32; hidden layers ``width`` x
    ``width``) for each configuration of
    :data:`TIMELINE_CONFIGS`. Returns ``(events, summary)``: events (``merge_event_logs`` of
    every rank: all-gather / forward / backward / reduce-scatter spans, shared host clock, per
    config; the last of 3 steps) and summary (per rank and config: peak_bytes, MemoryMeter's
    peak over forward and backward; wire_bytes, measured; all_gathers, calls counted)."""
    from course_lib.measure.timing import merge_event_logs

    configs = validate.choices("configs", configs, tuple(TIMELINE_CONFIGS))
    n = validate.count("world_size", world_size, minimum=2)
    width = validate.count("width", width, minimum=2)
    depth = validate.count("depth", depth, minimum=1)
    batch = validate.count("batch", batch, minimum=1)
    res = launch(_timeline_worker, n, configs, width, depth, batch)
    events = merge_event_logs([r["events"] for r in res])
    events["config"] = [m["config"] for m in events["meta"]]
    summary = kit.frame([row for r in res for row in r["rows"]], TimelineRow)
    return events, summary
