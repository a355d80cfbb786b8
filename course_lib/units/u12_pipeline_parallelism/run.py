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
- :func:`activation_memory`: peak activation bytes per stage (MemoryMeter), GPipe vs 1F1B;
- :func:`wire_bytes`: sends, receives and bytes each rank wrote to its sockets in one bf16 step;
- :func:`scale_table`, :func:`source_check`: 7B-70B and the sources' numbers through estimate.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

import pandas as pd
import torch
import torch.nn.functional as F

from course_lib import validate
from course_lib.measure import estimate
from course_lib.measure.timing import merge_event_logs
from course_lib.parallel import harness as H
from course_lib.parallel import pipeline as P
from course_lib.runtime.launch import launch

__all__ = [
    "Setup",
    "batch_fn",
    "reference",
    "parity",
    "timelines",
    "bubble_table",
    "replayed_bubble",
    "activation_memory",
    "wire_bytes",
    "message_table",
    "scale_table",
    "source_check",
    "TORCH_SCHEDULES",
]

#: our schedule -> torch.distributed.pipelining's class of the same name
TORCH_SCHEDULES = {
    "gpipe": "ScheduleGPipe",
    "1f1b": "Schedule1F1B",
    "interleaved": "ScheduleInterleaved1F1B",
}


class Setup(dict):
    """The model and batch of a run: n_layers, width, seq, rows (batch rows), dtype."""

    def __init__(
        self,
        *,
        n_layers: int = 8,
        width: int = 32,
        seq: int = 16,
        rows: int = 8,
        dtype: torch.dtype = torch.float64,
    ):
        super().__init__(
            n_layers=validate.count("n_layers", n_layers, minimum=1),
            width=validate.count("width", width, minimum=4),
            seq=validate.count("seq", seq, minimum=1),
            rows=validate.count("rows", rows, minimum=1),
            dtype=dtype,
        )

    def model(self, seed: int = 0):
        return P.make_stack(
            self["n_layers"], width=self["width"], seq=self["seq"], seed=seed, dtype=self["dtype"]
        )


def batch_fn(step: int, setup: Setup):
    """Inputs (rows, seq, width) and targets of the same shape for step ``step``: a regression
    of the stack's output onto random targets (the loss is an MSE, a mean over the batch)."""
    g = torch.Generator().manual_seed(1000 + step)
    shape = (setup["rows"], setup["seq"], setup["width"])
    return (
        torch.randn(shape, generator=g, dtype=setup["dtype"]),
        torch.randn(shape, generator=g, dtype=setup["dtype"]),
    )


def _loss(model, batch):
    return F.mse_loss(model(batch[0]), batch[1])


def reference(setup: Setup, steps: int = 1) -> H.Record:
    """``steps`` SGD steps of the whole stack on one process, on the full batch (one intra-op
    thread: on a loaded 2-core machine two threads wait on each other, 30 times slower here)."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return H.reference_run(
            setup.model, lambda s: batch_fn(s, setup), steps=steps, loss_fn=_loss
        )
    finally:
        torch.set_num_threads(saved)


def _config(schedule: str, ranks: int, microbatches: int, virtual: int, setup: Setup):
    return P.check_pipeline(
        schedule,
        n_layers=setup["n_layers"],
        ranks=ranks,
        microbatches=microbatches,
        batch_rows=setup["rows"],
        virtual=virtual,
    )


# --------------------------------------------------------------------------------------------
# parity: ours and torch's against one process
# --------------------------------------------------------------------------------------------
def _torch_step(model: P.PipelineRank, name: str, microbatches: int):
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

    def step_fn(mod, batch):
        x, y = batch
        losses: list = []
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
        rows.append(
            {
                "implementation": key[0],
                "schedule": key[1],
                "virtual": key[2],
                "comparisons": len(table),
                "failed": int((~table.ok).sum()),
                "worst": float((table.max_abs_diff / table.tolerance).max()),
                "ok": bool(table.ok.all()),
            }
        )
    return pd.DataFrame(rows)


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
    held = pd.DataFrame([{"rank": r["rank"], **r["meta"]} for r in memory])
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
        rows.append(
            {
                "schedule": s,
                "virtual": v,
                "measured": statistics.fmean(idle.values()),
                "min_rank": min(idle.values()),
                "max_rank": max(idle.values()),
                "replayed": replayed_bubble(
                    s,
                    ranks=p,
                    microbatches=m,
                    virtual=v,
                    n_layers=events.attrs["n_layers"],
                    orders=_recorded_orders(ev, p),
                ),
                "predicted": predicted,
                "narayanan": None if s == "naive" else estimate.pipeline_bubble_ratio(p, m, v),
            }
        )
    df = pd.DataFrame(rows)
    df["residual"] = df["measured"] - df["predicted"]
    return df


# --------------------------------------------------------------------------------------------
# activation memory per stage
# --------------------------------------------------------------------------------------------
def _memory_worker(rank, world_size, schedules, microbatches, setup):
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
        rows.append(
            {
                "schedule": name,
                "stage": rank,
                "peak_activations": int(mem.timeline["activations"].max()),
                "per_microbatch": per_mb,
                "held": model.max_in_flight[rank],
            }
        )
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
    df = pd.DataFrame(
        [
            r
            for res in launch(_memory_worker, ranks, list(schedules), microbatches, setup)
            for r in res
        ]
    )
    df["measured_mb"] = df["peak_activations"] / df["per_microbatch"]
    df["predicted"] = [
        {"gpipe": microbatches, "naive": 1}.get(s, min(ranks - st, microbatches))
        for s, st in zip(df["schedule"], df["stage"])
    ]
    return df.sort_values(["schedule", "stage"], ignore_index=True)


# --------------------------------------------------------------------------------------------
# bytes on the wire
# --------------------------------------------------------------------------------------------
def _wire_worker(rank, world_size, items, microbatches, setup):
    import torch.distributed as dist

    from course_lib.measure.comm import CommMeter

    x, y = batch_fn(0, setup)
    rows = []
    for name, v in items:
        split = _config(name, world_size, microbatches, v, setup)
        model = P.PipelineRank(setup.model(), split, rank, world_size)
        order = P.schedule_order(name, rank, world_size, microbatches, v)
        P.run_schedule(model, order, x, y, microbatches=microbatches, loss_fn=F.mse_loss)
        dist.barrier()  # a warm step first: gloo opens its connections
        with CommMeter(dispatch=False) as comm:
            P.run_schedule(model, order, x, y, microbatches=microbatches, loss_fn=F.mse_loss)
        rows.append(
            {
                "schedule": name,
                "virtual": v,
                "rank": rank,
                "sends": comm.calls.get("isend", 0),
                "recvs": comm.calls.get("recv", 0),
                "model_bytes": int(comm.model_bytes_sent),
                "wire_bytes": comm.wire_bytes_sent,
                "wire_source": comm.wire_source,
            }
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
    df = pd.DataFrame(
        [r for res in launch(_wire_worker, ranks, items, microbatches, setup) for r in res]
    )
    df["boundary"] = estimate.pipeline_boundary_bytes(batch, seq, width, dtype_bytes=2)
    df["predicted"] = df["sends"] * df["boundary"]
    df["residual"] = [None if w is None else w - p for w, p in zip(df.wire_bytes, df.predicted)]
    return df


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
            {
                "model": name,
                "layers": layers,
                "hidden": h,
                "layers_per_stage": layers / p,
                "boundary_bytes": boundary,
                "sent_per_rank_step": per_step,
                "send_s": per_step / (speed.per_direction_GBps * 1e9),
                "bubble_1f1b": estimate.pipeline_bubble_fraction(p, m),
                "bubble_v2": estimate.pipeline_bubble_fraction(p, m, 2),
                "bubble_v4": estimate.pipeline_bubble_fraction(p, m, 4),
            }
        )
    return pd.DataFrame(rows)


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
