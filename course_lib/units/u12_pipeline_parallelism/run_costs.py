"""Unit 12, what a pipeline costs: activation memory per stage, bytes on the wire, and at scale.

Used by notebooks/12_pipeline_parallelism.ipynb through :mod:`run` (which re-exports these names).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd
import torch
import torch.nn.functional as F

from course_lib import kit, validate
from course_lib.measure import estimate
from course_lib.parallel import pipeline as P
from course_lib.runtime.launch import launch
from course_lib.units.u12_pipeline_parallelism._setup import (
    Setup,
    _config,
    batch_fn,
)


# --------------------------------------------------------------------------------------------
# activation memory per stage
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ActivationRow:
    """One schedule and stage of :func:`activation_memory`."""

    schedule: str
    stage: int
    peak_activations: int
    per_microbatch: int
    held: int
    measured_mb: float
    predicted: int


def _memory_worker(
    rank: int, world_size: int, schedules: Sequence[str], microbatches: int, setup: Setup
) -> list[ActivationRow]:
    from course_lib.measure.memory import MemoryMeter

    x, y = batch_fn(0, setup)
    split = _config("gpipe", world_size, microbatches, 1, setup)
    rows = []
    # one micro-batch's activations on this stage, measured alone
    model = P.PipelineRank(setup.model(), split, rank, world_size)
    xm = x.chunk(microbatches)[0]
    with MemoryMeter(model) as one:
        model.stages[str(rank)](xm.clone().requires_grad_(rank > 0))
    per_mb = int(one.timeline["activations"].max())
    for name in schedules:
        model = P.PipelineRank(setup.model(), split, rank, world_size)
        order = P.schedule_order(name, rank, world_size, microbatches)
        with MemoryMeter(model) as mem:
            P.run_schedule(model, order, x, y, microbatches=microbatches, loss_fn=F.mse_loss)
        peak = int(mem.timeline["activations"].max())
        predicted = {"gpipe": microbatches, "naive": 1}.get(
            name, min(world_size - rank, microbatches)
        )
        held = model.max_in_flight[rank]
        rows.append(ActivationRow(name, rank, peak, per_mb, held, peak / per_mb, predicted))
    return rows


def activation_memory(
    schedules: Sequence[str] = ("gpipe", "1f1b"),
    *,
    ranks: int = 4,
    microbatches: int = 8,
    setup: Setup | None = None,
) -> pd.DataFrame:
    """Peak activation bytes of each stage in one step (MemoryMeter's activations category,
    max over its timeline: what autograd saved plus the received inputs), beside one
    micro-batch's activations measured alone on that stage. One row per schedule and stage:
    peak_activations, per_microbatch (B), measured_mb (their ratio), held (micro-batches the
    executor held at once), predicted (GPipe m; 1F1B p - stage; naive 1)."""
    schedules = validate.choices("schedules", schedules, ("naive", "gpipe", "1f1b"))
    ranks = validate.count("ranks", ranks, minimum=1)
    setup = setup or Setup(
        n_layers=ranks, width=32, seq=16, rows=2 * microbatches, dtype=torch.float32
    )
    _config("1f1b" if "1f1b" in schedules else "gpipe", ranks, microbatches, 1, setup)
    res = launch(_memory_worker, ranks, list(schedules), microbatches, setup)
    df = kit.frame(kit.rows_of(res, ActivationRow), ActivationRow)
    return df.sort_values(["schedule", "stage"], ignore_index=True)


# --------------------------------------------------------------------------------------------
# bytes on the wire
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class WireRow:
    """One schedule and rank of :func:`wire_bytes` (bytes of one step)."""

    schedule: str
    virtual: int
    rank: int
    sends: int
    recvs: int
    model_bytes: int
    wire_bytes: int | None
    wire_source: str
    boundary: int
    predicted: int
    residual: int | None


def _wire_worker(
    rank: int,
    world_size: int,
    items: Sequence[tuple[str, int]],
    microbatches: int,
    setup: Setup,
) -> list[WireRow]:
    import torch.distributed as dist

    from course_lib.measure.comm import CommMeter

    x, y = batch_fn(0, setup)
    boundary = estimate.pipeline_boundary_bytes(
        setup["rows"] // microbatches, setup["seq"], setup["width"], dtype_bytes=2
    )
    rows = []
    for name, v in items:
        split = _config(name, world_size, microbatches, v, setup)
        model = P.PipelineRank(setup.model(), split, rank, world_size)
        order = P.schedule_order(name, rank, world_size, microbatches, v)
        P.run_schedule(model, order, x, y, microbatches=microbatches, loss_fn=F.mse_loss)
        dist.barrier()  # a warm step first: gloo opens its connections
        with CommMeter(dispatch=False) as comm:
            P.run_schedule(model, order, x, y, microbatches=microbatches, loss_fn=F.mse_loss)
        sends, wire = comm.calls.get("isend", 0), comm.wire_bytes_sent
        rows.append(
            WireRow(
                schedule=name,
                virtual=v,
                rank=rank,
                sends=sends,
                recvs=comm.calls.get("recv", 0),
                model_bytes=int(comm.model_bytes_sent),
                wire_bytes=wire,
                wire_source=comm.wire_source,
                boundary=boundary,
                predicted=sends * boundary,
                residual=None if wire is None else wire - sends * boundary,
            )
        )
        dist.barrier()
    return rows


def wire_bytes(
    schedules: Sequence[str] = ("gpipe", "1f1b", "interleaved"),
    *,
    ranks: int = 4,
    microbatches: int = 8,
    virtual: int = 2,
    batch: int = 2,
    seq: int = 64,
    width: int = 64,
) -> pd.DataFrame:
    """One step in bfloat16 with micro-batches of ``batch`` rows, measured by CommMeter in each
    rank. One row per schedule and rank: sends (isend calls), recvs, boundary (bytes of one
    activation, ``estimate.pipeline_boundary_bytes``: 2bsh), predicted (sends x boundary),
    model_bytes (CommMeter's payload sum), wire_bytes (MEASURED: written to the sockets,
    /proc/self/io wchar), residual (wire - predicted: gloo's 96 B header per message and 48 B
    per receive)."""
    schedules = validate.choices("schedules", schedules, P.SCHEDULES)
    ranks = validate.count("ranks", ranks, minimum=2)
    setup = Setup(
        n_layers=2 * ranks, width=width, seq=seq, rows=batch * microbatches, dtype=torch.bfloat16
    )
    items = [(s, virtual if s == "interleaved" else 1) for s in schedules]
    for s, v in items:
        _config(s, ranks, microbatches, v, setup)
    res = launch(_wire_worker, ranks, items, microbatches, setup)
    return kit.frame(kit.rows_of(res, WireRow), WireRow)


def message_table(df: pd.DataFrame, *, ranks: int, microbatches: int) -> pd.DataFrame:
    """Per schedule: messages counted over all ranks beside ``estimate.pipeline_messages``."""
    g = df.groupby(["schedule", "virtual"], sort=False, as_index=False).agg(
        sends=("sends", "sum"),
        recvs=("recvs", "sum"),
        wire_bytes=("wire_bytes", "sum"),
        predicted_bytes=("predicted", "sum"),
    )
    g["predicted_messages"] = [
        estimate.pipeline_messages(ranks, microbatches, v) for v in g["virtual"]
    ]
    return g


# --------------------------------------------------------------------------------------------
# at scale, through estimate
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PipelineScaleRow:
    """:func:`scale_table`: one model's boundary bytes, send time and bubbles at scale."""

    model: str
    layers: int
    hidden: int
    layers_per_stage: float
    boundary_bytes: int
    sent_per_rank_step: int
    send_s: float
    bubble_1f1b: float
    bubble_v2: float
    bubble_v4: float


def scale_table(
    models: Sequence[tuple[str, int, int]] = (("7B", 32, 4096), ("70B", 80, 8192)),
    *,
    stages: int = 8,
    microbatches: int = 32,
    micro_batch: int = 1,
    seq: int = 4096,
    link: str = "InfiniBand NDR",
) -> pd.DataFrame:
    """Pipeline facts at 7B / 70B (name, layers, hidden h): the boundary activation of one
    micro-batch (2bsh B in bf16), what one rank sends per step (2 m boundaries: forward and
    backward), its time on ``link`` at the per-direction bandwidth, and the bubble with 1F1B and
    interleaved (v = 2, 4). Bytes in B; seconds."""
    p = validate.count("stages", stages, minimum=1)
    m = validate.count("microbatches", microbatches, minimum=1)
    speed = estimate.link_speed(link)
    rows = []
    for name, layers, h in models:
        boundary = estimate.pipeline_boundary_bytes(micro_batch, seq, h, dtype_bytes=2)
        per_step = 2 * m * boundary
        rows.append(
            PipelineScaleRow(
                name, layers, h, layers / p, boundary, per_step,
                per_step / (speed.per_direction_GBps * 1e9),
                *(estimate.pipeline_bubble_fraction(p, m, v) for v in (1, 2, 4)),
            )
        )  # fmt: skip
    return kit.frame(rows, PipelineScaleRow)


def source_check() -> pd.DataFrame:
    """The sources' pipeline numbers recomputed: each row a claim, the value recomputed with
    estimate, and which definition of the bubble it uses."""
    E = estimate
    rows = [
        ("S1: utilization m/(m+p-1) at p 4, m 8", 1 - E.pipeline_bubble_fraction(4, 8), "fraction"),
        ("S2: utilization at m = 4p, p = 4", 1 - E.pipeline_bubble_fraction(4, 16), "fraction"),
        ("S2: utilization at m = 4p, p = 8", 1 - E.pipeline_bubble_fraction(8, 32), "fraction"),
        ("S4: naive pipeline idle at 8 stages", 7 / 8, "(p-1)/p"),
        (
            "S4 ex. 3: smallest m, bubble < 10 %, p = 4",
            E.microbatches_for_bubble(4, 0.1),
            "fraction",
        ),
        (
            "S4 ex. 3: same, Narayanan's (p-1)/m",
            E.microbatches_for_bubble(4, 0.1, definition="ratio"),
            "ratio",
        ),
        ("S4 ex. 3: smallest m, p = 8", E.microbatches_for_bubble(8, 0.1), "fraction"),
        (
            "S4 ex. 3: same, Narayanan's (p-1)/m",
            E.microbatches_for_bubble(8, 0.1, definition="ratio"),
            "ratio",
        ),
        (
            "S1: boundary activation, b 2, s 2048, h 4096, bf16 (MiB)",
            E.pipeline_boundary_bytes(2, 2048, 4096) / 2**20,
            "2bsh",
        ),
    ]
    return pd.DataFrame(rows, columns=["claim", "value", "definition"])
