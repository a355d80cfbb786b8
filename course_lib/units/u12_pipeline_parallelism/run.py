"""Unit 12's measured runs (notebooks/12_pipeline_parallelism.ipynb): pipeline parallelism on
real ranks.

Every run goes through ``course_lib.launch`` (gloo on CPU) and the course's from-scratch
``parallel.pipeline`` (split, schedules, send/recv executor), beside torch's own
``torch.distributed.pipelining`` (``ScheduleGPipe``, ``Schedule1F1B``,
``ScheduleInterleaved1F1B``), which runs on gloo/CPU in torch 2.13. Each function returns a
DataFrame or plain data:

- :func:`parity`: one step of each schedule against one process on the full batch, and
  against torch's schedules on the same split (harness);
- :func:`timelines`: every rank's F/B spans of one step per schedule on the shared clock, the
  waits for messages, and how many micro-batches each stage held at once;
- :func:`bubble_table`: the idle fraction measured on each rank's timeline beside
  ``estimate.pipeline_bubble_fraction`` and the same orders replayed on ideal hardware;
- :func:`sleep_bubble_table`: the bubble measured on ranks whose stages sleep instead of
  computing (the core stays free, as on one GPU per stage), beside the formula;
- :func:`activation_memory`: peak activation bytes per stage (MemoryMeter), GPipe vs 1F1B;
- :func:`wire_bytes`: sends, receives and bytes each rank wrote to its sockets in one bf16 step;
- :func:`weight_versions`: PipeDream-2BW's two weight versions beside GPipe/1F1B's one and
  PipeDream's p - s, measured in one process, with their loss curves;
- :func:`scale_table`, :func:`source_check`: 7B-70B and the sources' numbers through estimate;
- :func:`pp_threshold` (``run_threshold.py``): where the stage-to-stage sends hide, measured.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd
import torch
import torch.nn.functional as F

from course_lib import kit, validate
from course_lib.measure import estimate
from course_lib.measure.timing import merge_event_logs
from course_lib.parallel import harness as H
from course_lib.parallel import pipeline as P
from course_lib.runtime.launch import launch
from course_lib.units.u12_pipeline_parallelism._setup import (
    TORCH_SCHEDULES,
    Setup,
    _config,
    batch_fn,
    reference,
)
from course_lib.units.u12_pipeline_parallelism.run_bubble import (
    SLEEP_TOLERANCE,
    SleepLayer,
    sleep_bubble_table,
)
from course_lib.units.u12_pipeline_parallelism.run_costs import (
    activation_memory,
    message_table,
    scale_table,
    source_check,
    wire_bytes,
)
from course_lib.units.u12_pipeline_parallelism.run_threshold import pp_threshold
from course_lib.units.u12_pipeline_parallelism.run_versions import (
    weight_versions,
)

__all__ = [
    "Setup",
    "batch_fn",
    "reference",
    "parity",
    "timelines",
    "bubble_table",
    "replayed_bubble",
    "sleep_bubble_table",
    "SleepLayer",
    "SLEEP_TOLERANCE",
    "activation_memory",
    "wire_bytes",
    "message_table",
    "scale_table",
    "source_check",
    "TORCH_SCHEDULES",
    "weight_versions",
    "pp_threshold",
]


# --------------------------------------------------------------------------------------------
# parity: ours and torch's against one process
# --------------------------------------------------------------------------------------------
def _torch_step(model: P.PipelineRank, name: str, microbatches: int) -> H.StepFn:
    """A step_fn running torch.distributed.pipelining's schedule on this rank's stages."""
    import torch.distributed.pipelining as pp

    n = len(model.split)
    stages = [
        pp.PipelineStage(model.stages[str(k)], k, n, torch.device("cpu")) for k in model.stage_ids
    ]
    cls = getattr(pp, TORCH_SCHEDULES[name])
    sched = cls(
        stages if name == "interleaved" else stages[0],
        n_microbatches=microbatches,
        loss_fn=F.mse_loss,
    )  # scale_grads=True: gradients of the mean over micro-batches
    first, last = 0 in model.stage_ids, n - 1 in model.stage_ids

    def step_fn(mod: torch.nn.Module, batch: H.Batch) -> torch.Tensor | None:
        x, y = batch
        losses: list[torch.Tensor] = []
        kwargs = {"target": y, "losses": losses} if last else {}
        sched.step(*([x] if first else []), **kwargs)
        return torch.stack(losses).mean() if last else None

    return step_fn


def _parity_worker(rank, world_size, items, microbatches, setup, steps):
    out = {}
    gather = lambda mod, which: H.merge_across(mod.tensors(which))  # noqa: E731
    for impl, name, v in items:
        split = _config(name, world_size, microbatches, v, setup)
        model = P.PipelineRank(setup.model(), split, rank, world_size)
        if impl == "course":
            order = P.schedule_order(name, rank, world_size, microbatches, v)

            def step_fn(mod, batch, order=order):
                return P.run_schedule(
                    mod, order, *batch, microbatches=microbatches, loss_fn=F.mse_loss
                )
        else:
            step_fn = _torch_step(model, name, microbatches)
        out[(impl, name, v)] = H.parallel_run(
            model, lambda s: batch_fn(s, setup), steps=steps, step_fn=step_fn, gather_fn=gather
        )
    return out


@dataclass(frozen=True)
class ParityRow:
    """One implementation and schedule of :func:`parity`."""

    implementation: str
    schedule: str
    virtual: int
    comparisons: int
    failed: int
    worst: float
    ok: bool


@dataclass(frozen=True)
class HeldRow:
    """:func:`timelines` (``attrs["held"]``): the most micro-batches one stage held."""

    rank: int
    lane: str
    schedule: str
    virtual: int
    stage: int
    held: int


@dataclass(frozen=True)
class BubbleRow:
    """:func:`bubble_table`: one schedule's idle fraction, measured beside its predictions."""

    schedule: str
    virtual: int
    measured: float
    min_rank: float
    max_rank: float
    replayed: float
    predicted: float
    narayanan: float | None
    residual: float


def parity(
    schedules: Sequence[str] = ("naive", "gpipe", "1f1b", "interleaved"),
    *,
    ranks: int = 4,
    microbatches: int = 4,
    virtual: int = 2,
    steps: int = 2,
    torch_schedules: bool = True,
    setup: Setup | None = None,
) -> pd.DataFrame:
    """``steps`` SGD steps (float64) of an 8-block stack on ``ranks`` ranks under each schedule,
    ours and (where torch has one) torch.distributed.pipelining's, each against one process on
    the full batch. One row per implementation and schedule: comparisons (loss, gradients,
    parameters of every step), failed, worst (max |diff| / tolerance; harness tolerance
    rtol 1e-5 x max|ref| + atol 1e-6 per tensor), ok."""
    schedules = validate.choices("schedules", schedules, P.SCHEDULES)
    ranks = validate.count("ranks", ranks, minimum=1)
    setup = setup or Setup()
    items = [("course", s, virtual if s == "interleaved" else 1) for s in schedules]
    if torch_schedules:
        items += [("torch", s, v) for _, s, v in items if s in TORCH_SCHEDULES]
    for _, s, v in items:  # refuse bad input before any rank starts
        _config(s, ranks, microbatches, v, setup)
    ref = reference(setup, steps)
    records = launch(_parity_worker, ranks, items, microbatches, setup, steps)
    rows = []
    for key in items:
        table = H.compare(ref, [r[key] for r in records])
        worst = float((table.max_abs_diff / table.tolerance).max())
        rows.append(
            ParityRow(*key, len(table), int((~table.ok).sum()), worst, bool(table.ok.all()))
        )
    return kit.frame(rows, ParityRow)


# --------------------------------------------------------------------------------------------
# timelines and the bubble
# --------------------------------------------------------------------------------------------
def _timeline_worker(rank, world_size, items, microbatches, setup, repeats):
    import torch.distributed as dist

    from course_lib.measure.timing import EventLog

    out = []
    x, y = batch_fn(0, setup)
    for name, v in items:
        split = _config(name, world_size, microbatches, v, setup)
        model = P.PipelineRank(setup.model(), split, rank, world_size)
        order = P.schedule_order(name, rank, world_size, microbatches, v)
        for it in range(repeats + 1):  # the first step warms up (allocations, connections)
            log = EventLog(rank)
            dist.barrier()
            P.run_schedule(
                model, order, x, y, microbatches=microbatches, loss_fn=F.mse_loss, log=log
            )
            if it:
                out += [
                    {**r, "meta": {**r["meta"], "schedule": name, "virtual": v, "repeat": it}}
                    for r in log.to_records()
                ]
        in_flight = model.max_in_flight
        out += [
            {
                "rank": rank,
                "name": "in_flight",
                "start_ns": 0,
                "end_ns": 0,
                "meta": {"lane": "memory", "schedule": name, "virtual": v, "stage": k, "held": n},
            }
            for k, n in in_flight.items()
        ]
    return out


def timelines(
    schedules: Sequence[str] = ("naive", "gpipe", "1f1b", "interleaved"),
    *,
    ranks: int = 4,
    microbatches: int = 8,
    virtual: int = 2,
    n_layers: int = 8,
    width: int = 128,
    seq: int = 64,
    rows: int = 16,
    repeats: int = 1,
) -> pd.DataFrame:
    """One step (after a warm-up step) of each schedule on ``ranks`` ranks, float32, every
    rank recording its F/B spans (lane "compute": stage, mb, kind), its waits for a message
    (lane "wait") and the most micro-batches each stage held (lane "memory": stage, held).
    Columns of ``merge_event_logs`` plus schedule, virtual, repeat; times in seconds from the
    first event of each step. Absolute times are this machine's and are never graded."""
    schedules = validate.choices("schedules", schedules, P.SCHEDULES)
    ranks = validate.count("ranks", ranks, minimum=1)
    repeats = validate.count("repeats", repeats, minimum=1, maximum=5)
    setup = Setup(n_layers=n_layers, width=width, seq=seq, rows=rows, dtype=torch.float32)
    items = [(s, virtual if s == "interleaved" else 1) for s in schedules]
    for s, v in items:
        _config(s, ranks, microbatches, v, setup)
    records = [
        r
        for res in launch(_timeline_worker, ranks, items, microbatches, setup, repeats)
        for r in res
    ]
    memory = [r for r in records if r["meta"]["lane"] == "memory"]
    frames = []
    for s, _v in items:
        for it in range(1, repeats + 1):
            mine = [
                r
                for r in records
                if r["meta"]["lane"] != "memory"
                and r["meta"]["schedule"] == s
                and r["meta"]["repeat"] == it
            ]
            frames.append(merge_event_logs([mine]))
    df = pd.concat(frames, ignore_index=True)
    held = kit.frame([HeldRow(rank=r["rank"], **r["meta"]) for r in memory], HeldRow)
    df.attrs["held"] = held
    df.attrs.update(ranks=ranks, microbatches=microbatches, n_layers=n_layers)
    return df


def replayed_bubble(
    schedule: str,
    *,
    ranks: int,
    microbatches: int,
    virtual: int = 1,
    n_layers: int | None = None,
    orders=None,
) -> float:
    """The idle fraction of ``schedule`` replayed on ideal hardware (``pipeline.replay``: F
    costs a stage's layers, B twice that, messages free), mean over ranks. ``orders``: each
    rank's recorded actions (default: the schedule's own)."""
    n_layers = n_layers or ranks * virtual
    split = P.split_layers(n_layers, ranks * virtual)
    if orders is None:
        orders = [P.schedule_order(schedule, r, ranks, microbatches, virtual) for r in range(ranks)]
    spans = pd.DataFrame(P.replay(orders, split)).assign(lane="compute")
    return statistics.fmean(P.bubble_from_events(spans).values())


def _recorded_orders(events: pd.DataFrame, ranks: int) -> list[list[P.Action]]:
    ev = events[events["lane"] == "compute"].sort_values("start", kind="stable")
    return [
        [P.Action(k, int(mb), int(s)) for k, mb, s in zip(e["kind"], e["mb"], e["stage"])]
        for _, e in sorted(ev.groupby("rank"), key=lambda kv: kv[0])
    ][:ranks]


def bubble_table(events: pd.DataFrame) -> pd.DataFrame:
    """Per schedule: measured (mean over ranks of the idle fraction of each rank's timeline,
    1 - its F/B time / the step's span), min and max over ranks, replayed (the order each rank
    really ran, replayed on ideal hardware), predicted (``estimate.pipeline_bubble_fraction``;
    the naive schedule's (p-1)/p), narayanan ((p-1)/(v·m), bubble over ideal time), residual
    (measured - predicted)."""
    p, m = events.attrs["ranks"], events.attrs["microbatches"]
    rows = []
    for (s, v), ev in events.groupby(["schedule", "virtual"], sort=False):
        ev = ev[ev["repeat"] == ev["repeat"].min()]
        idle = P.bubble_from_events(ev)
        predicted = (p - 1) / p if s == "naive" else estimate.pipeline_bubble_fraction(p, m, v)
        measured = statistics.fmean(idle.values())
        replayed = replayed_bubble(
            s, ranks=p, microbatches=m, virtual=v, n_layers=events.attrs["n_layers"],
            orders=_recorded_orders(ev, p),
        )  # fmt: skip
        ratio = None if s == "naive" else estimate.pipeline_bubble_ratio(p, m, v)
        rows.append(
            BubbleRow(
                s, v, measured, min(idle.values()), max(idle.values()), replayed, predicted,
                ratio, measured - predicted,
            )
        )  # fmt: skip
    return kit.frame(rows, BubbleRow)
