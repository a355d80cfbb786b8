"""Unit 12, the bubble measured on stages whose compute frees the core.

On this course's reference machine (2 CPU cores shared by 4 ranks) the measured bubble of
:func:`run.bubble_table` is mostly contention: while 4 ranks compute, each F/B stretches. Here
each stage's layers are replaced by a *timed sleep* standing in for a GPU kernel: the rank does
its work by waiting a fixed time, as a rank waits for its own GPU, so ranks never compete for a
core. Everything else is real: the course's schedules and executor (``parallel.pipeline``),
gloo send/recv between the ranks, every F/B span recorded on the shared host clock, and the
idle fraction read from those spans (``pipeline.bubble_from_events``), the same measurement as
the contention run. Used by notebooks/12_pipeline_parallelism.ipynb through :mod:`run`.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn

from course_lib import kit, validate
from course_lib.measure import estimate
from course_lib.parallel import pipeline as P
from course_lib.runtime.launch import launch

#: stated tolerance of the sleep stand-in: |measured - formula| of the bubble fraction
SLEEP_TOLERANCE = 0.03


class _Sleep(torch.autograd.Function):
    """Identity whose forward waits ``forward_s`` and backward ``backward_s`` seconds."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, forward_s: float, backward_s: float) -> torch.Tensor:
        time.sleep(forward_s)
        ctx.backward_s = backward_s
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        time.sleep(ctx.backward_s)
        return grad, None, None


class SleepLayer(nn.Module):
    """A layer whose forward takes ``forward_s`` seconds and backward ``backward_s``, spent
    sleeping (the core is free meanwhile); one scalar parameter so that it has a gradient."""

    def __init__(self, forward_s: float, backward_s: float) -> None:
        super().__init__()
        self.forward_s, self.backward_s = forward_s, backward_s
        self.scale = nn.Parameter(torch.ones(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _Sleep.apply(x * self.scale, self.forward_s, self.backward_s)


@dataclass(frozen=True)
class SleepBubbleRow:
    """One (p, m, schedule) of :func:`sleep_bubble_table`: idle fractions over the ranks."""

    p: int
    m: int
    schedule: str
    virtual: int
    measured: float
    min_rank: float
    max_rank: float
    predicted: float
    residual: float
    within: bool


def _sleep_worker(
    rank: int, world_size: int, cases, forward_s: float, repeats: int
) -> list[SleepBubbleRow]:
    import torch.distributed as dist

    from course_lib.measure.timing import EventLog, merge_event_logs

    torch.set_num_threads(1)
    rows = []
    for schedule, m, v in cases:
        n = world_size * v  # one layer per stage; a stage of v per rank costs 1/v of a layer
        layers = nn.Sequential(*[SleepLayer(forward_s / v, 2 * forward_s / v) for _ in range(n)])
        model = P.PipelineRank(layers, P.split_layers(n, n), rank, world_size)
        order = P.schedule_order(schedule, rank, world_size, m, v)
        x, y = torch.randn(m, 4), torch.randn(m, 4)
        steps = []
        for it in range(repeats + 1):  # the first step warms up (gloo connections)
            log = EventLog(rank)
            dist.barrier()
            P.run_schedule(model, order, x, y, microbatches=m, loss_fn=F.mse_loss, log=log)
            if it:
                spans = [r for r in log.to_records() if r["meta"]["lane"] == "compute"]
                gathered: list[Any] = [None] * world_size
                dist.all_gather_object(gathered, spans)
                steps.append(P.bubble_from_events(merge_event_logs(gathered)))
        # a late wake-up only ever adds idle time: keep the least disturbed step
        idle = min(steps, key=lambda d: statistics.fmean(d.values()))
        mean = statistics.fmean(idle.values())
        pred = estimate.pipeline_bubble_fraction(world_size, m, v)
        rows.append(
            SleepBubbleRow(
                world_size,
                m,
                schedule,
                v,
                mean,
                min(idle.values()),
                max(idle.values()),
                pred,
                mean - pred,
                abs(mean - pred) <= SLEEP_TOLERANCE,
            )
        )
    return rows


def sleep_bubble_table(
    cases: Sequence[tuple[int, int]] = ((2, 4), (3, 6), (4, 8)),
    *,
    schedules: Sequence[str] = ("gpipe", "1f1b"),
    forward_s: float = 0.05,
    repeats: int = 2,
) -> pd.DataFrame:
    """The bubble of each schedule for each (p, m) in ``cases``, MEASURED on p real gloo ranks
    whose stages sleep ``forward_s`` seconds per F and twice that per B (one warm-up step, then
    ``repeats`` recorded steps; the step with the least idle time is kept: on a shared machine
    noise only adds idle time). A step lasts about 3 (m + p - 1) ``forward_s``; each message and wake-up
    on a loaded machine adds ~1 ms, so keep ``forward_s`` >= 0.05 s for the stated tolerance. One row per (p, m, schedule): measured (mean over ranks of 1 - the
    rank's F/B time / the step's span), min_rank, max_rank, predicted
    (``estimate.pipeline_bubble_fraction``), residual (measured - predicted), within
    (|residual| <= :data:`SLEEP_TOLERANCE`)."""
    schedules = validate.choices("schedules", schedules, ("gpipe", "1f1b", "interleaved"))
    forward_s = validate.number("forward_s", forward_s, positive=True)
    repeats = validate.count("repeats", repeats, minimum=1, maximum=5)
    if forward_s > 0.2:
        raise ValueError(f"forward_s = {forward_s}: expected at most 0.2 s (a step is minutes)")
    by_p: dict[int, list[tuple[str, int, int]]] = {}
    for p, m in cases:
        p = validate.count("cases[i][0] (p)", p, minimum=2, maximum=8)
        m = validate.count("cases[i][1] (m)", m, minimum=1, maximum=32)
        for s in schedules:
            v = 2 if s == "interleaved" else 1
            P.check_pipeline(s, n_layers=p * v, ranks=p, microbatches=m, batch_rows=m, virtual=v)
            by_p.setdefault(p, []).append((s, m, v))
    # one launch per pipeline depth; every rank gathered the same idle times: rank 0's rows
    runs = [launch(_sleep_worker, p, items, forward_s, repeats)[0] for p, items in by_p.items()]
    return kit.frame(kit.rows_of(runs, SleepBubbleRow), SleepBubbleRow)
