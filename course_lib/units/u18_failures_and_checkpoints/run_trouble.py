"""Unit 18, detecting trouble: a collective that hangs (the course's time-outs and every rank's
stack), a straggler (per-rank step times), and the gradient-norm clipping bug of sharded runs.

Used by notebooks/18_failures_and_checkpoints.ipynb through :mod:`run` (which re-exports these).
"""

from __future__ import annotations

import linecache
import re
import shutil
import tempfile
import textwrap
from dataclasses import dataclass, field

import pandas as pd

import course_lib
from course_lib import kit, validate
from course_lib.runtime.errors import LaunchError

#: the longest message a row of :func:`hung_collective` shows (whole words, then " …")
SAID_CHARS = 64


@dataclass(frozen=True)
class HungRow:
    """:func:`hung_collective`: one rank the launcher stopped."""

    rank: int
    said: str
    waiting_in: str = field(metadata=kit.column("waiting in"))


@dataclass(frozen=True)
class NormRow:
    """:func:`grad_norm_table`: one rank's gradient norms and the clip scale each gives."""

    rank: int
    local: float = field(metadata=kit.column("local norm (bug)"))
    all_reduced: float = field(metadata=kit.column("all-reduced norm"))
    full: float = field(metadata=kit.column("full norm (1 process)"))
    scale_bug: float = field(metadata=kit.column("scale (bug)"))
    scale_right: float = field(metadata=kit.column("scale (right)"))


def _hang_rank(rank, world_size):
    import torch
    import torch.distributed as dist

    t = torch.ones(4)
    if rank != 1:  # rank 1 "forgot" this all-reduce (a branch taken on one rank only)
        dist.all_reduce(t)
    dist.barrier()
    return float(t.sum())


def _where(text: str) -> str:
    """The line of this file a rank's stack was in (the collective it waited in): the frame's
    line number, from a traceback or from a hung rank's stack dump, read back from this file."""
    match = re.search(r'run_trouble\.py", line (\d+)', text)
    return linecache.getline(__file__, int(match.group(1))).strip() if match else "?"


def hung_collective(timeout: float = 4.0) -> pd.DataFrame:
    """Two ranks, one skipping an all-reduce the other waits in. ``course_lib.launch`` stops the
    run after ``timeout`` seconds (also the process group's collective time-out) and reports
    every rank with its stack. Rows: rank, what it said (first line, shortened), the line of
    the rank's code it was waiting in (from its stack)."""
    timeout = validate.number("timeout", timeout, positive=True)
    try:
        course_lib.launch(_hang_rank, 2, timeout=timeout)
    except LaunchError as err:
        failures = err.failures
    else:
        failures = {}  # nothing hung: no row
    rows = [HungRow(rank, _said(text), _where(text)) for rank, text in sorted(failures.items())]
    return kit.frame(rows, HungRow)


def _said(text: str) -> str:
    """What a failed rank said, for a table: its first line without the logger's ``[...] ``
    prefix, shortened to whole words within :data:`SAID_CHARS`."""
    first = text.splitlines()[0] if text else ""
    said = first.split("] ", 1)[-1] if "] " in first else first
    return textwrap.shorten(said, SAID_CHARS, placeholder=" …")


def straggler_table(
    *, slow_rank: int = 1, slow_s: float = 0.05, steps: int = 8, world_size: int = 2
) -> pd.DataFrame:
    """The unit's run with rank ``slow_rank`` sleeping ``slow_s`` per step before the gradient
    exchange. Rows per rank: mean seconds of own work per step (before the exchange) and of the
    whole step: every rank's step is as long as the slowest rank's work."""
    from course_lib.units.u18_failures_and_checkpoints.run_elastic import (
        elastic_run,
        read_timeline,
    )

    root = tempfile.mkdtemp(prefix="u18_straggler_")
    try:
        elastic_run(
            world_size,
            steps=validate.count("steps", steps, minimum=2),
            every=steps,
            root=root,
            slow_rank=slow_rank,
            slow_s=slow_s,
        )
        tl = read_timeline(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    steps_df = tl[(tl.event == "step") & (tl.step > 1)]  # the first step warms up
    out = steps_df.groupby("rank")[["work_s", "step_s"]].mean().reset_index()
    out["waits s"] = out["step_s"] - out["work_s"]
    return out.rename(columns={"work_s": "own work s", "step_s": "step s"})


def _norm_rank(rank, world_size, *, max_norm):
    import torch
    import torch.distributed as dist

    from course_lib.units.u18_failures_and_checkpoints import _train as T

    state = T.build(steps=4)
    data = T.make_data()
    T.train_step(state, data)  # moves the weights off their start
    full = T.set_gradients(state, data)[:-1]  # every rank: the whole gradient (reference)
    local = [p.grad.to_local() for p in state.model.parameters()]
    local_sq = sum(float((g.double() ** 2).sum()) for g in local)
    box = torch.tensor([local_sq], dtype=torch.float64)
    dist.all_reduce(box)
    local, total = local_sq**0.5, float(box.item()) ** 0.5
    scales = [min(1.0, max_norm / norm) for norm in (local, total)]
    return NormRow(rank, local, total, float(full.double().norm()), *scales)


def grad_norm_table(*, world_size: int = 2, max_norm: float = 0.3) -> pd.DataFrame:
    """The gradient norm each rank computes from its own shard (what a clip written for one
    process does on a ZeRO-3/FSDP shard) against the norm all-reduced over the shards and the
    full gradient's norm; and the clip scale each gives (``max_norm``)."""
    max_norm = validate.number("max_norm", max_norm, positive=True)
    rows = course_lib.launch(_norm_rank, world_size, max_norm=max_norm)
    return kit.frame(rows, NormRow)
