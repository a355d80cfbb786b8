"""Unit 18, failures: a run that saves every few steps, a rank killed under torchrun
``--max-restarts 1``, the restarted ranks resuming from the last checkpoint; its timeline.

Used by notebooks/18_failures_and_checkpoints.ipynb through :mod:`run` (which re-exports these)
and exported to torchrun by ``cluster.py`` (``u18.elastic``).
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass

import pandas as pd

import course_lib
from course_lib import kit, validate

#: the file in the checkpoint folder where every rank of every attempt logs its events
TIMELINE = "timeline.jsonl"


@dataclass(frozen=True)
class LossRow:
    """:func:`elastic_run`: one step of rank 0 in one attempt."""

    step: int
    loss: float
    attempt: int


@dataclass(frozen=True)
class EventRow:
    """:func:`read_timeline`: one event a rank logged (NaN or None: a field it does not log)."""

    t: float
    rank: int
    attempt: int
    event: str
    step: float = math.nan
    loss: float = math.nan
    work_s: float = math.nan
    step_s: float = math.nan
    error: str | None = None  # "peer lost" only


def _log(root: pathlib.Path, rank: int, attempt: int, event: str, **fields) -> None:
    line = json.dumps(
        {"t": time.time(), "rank": rank, "attempt": attempt, "event": event, **fields}
    )
    with open(root / TIMELINE, "a") as f:  # one short line per write: appends do not interleave
        f.write(line + "\n")


def _shared_root(root: str) -> tuple[pathlib.Path, bool]:
    """``root``, or a fresh temporary folder chosen by rank 0 and sent to every rank."""
    import torch.distributed as dist

    if root:
        pathlib.Path(root).mkdir(parents=True, exist_ok=True)
        return pathlib.Path(root), False
    box = [tempfile.mkdtemp(prefix="u18_elastic_") if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return pathlib.Path(str(box[0])), True


def _train(state, data, path, rank, attempt, steps, every, kill_step, kill_rank, delay) -> list:
    from course_lib import resilience
    from course_lib.units.u18_failures_and_checkpoints import _train as T

    losses = []
    for step, loss in T.steps_until(state, data, steps, delay_s=delay):
        losses.append(LossRow(step, loss, attempt))
        _log(path, rank, attempt, "step", step=step, loss=loss, **state.timing)
        if step % every == 0 and step < steps:
            resilience.save(state, path / f"step_{step:06d}")
            _log(path, rank, attempt, "saved", step=step)
        if attempt == 0 and rank == kill_rank and step == kill_step:
            _log(path, rank, attempt, "killed", step=step)
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGKILL)  # no clean-up, no goodbye: as a GPU falls off
    return losses


def _elastic_rank(rank, world_size, *, steps, every, kill_step, kill_rank, root, slow_rank, slow_s):
    import torch.distributed as dist

    from course_lib import resilience
    from course_lib.units.u18_failures_and_checkpoints import _train as T

    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    path, temporary = _shared_root(root)
    _log(path, rank, attempt, "start")
    state, data = T.build(steps=steps), T.make_data()
    last = resilience.latest(path)
    if last is not None:
        resilience.load(state, last)
        _log(path, rank, attempt, "loaded", step=state.step)
    delay = slow_s if rank == slow_rank else 0.0
    try:
        losses = _train(state, data, path, rank, attempt, steps, every, kill_step, kill_rank, delay)
    except RuntimeError as err:
        if "TORCHELASTIC_RUN_ID" not in os.environ:
            raise
        # under torchrun: a peer is gone (gloo: connection reset). Leave at once, without an
        # error report: the agent restarts every rank from the last checkpoint
        _log(path, rank, attempt, "peer lost", error=str(err).splitlines()[0][:120])
        os._exit(3)
    _log(path, rank, attempt, "done", step=state.step)
    if temporary:
        dist.barrier()
        if rank == 0:
            shutil.rmtree(path, ignore_errors=True)
    return losses


def elastic_run(
    world_size: int = 2,
    *,
    steps: int = 12,
    every: int = 4,
    kill_step: int = -1,
    kill_rank: int = 1,
    root: str = "",
    slow_rank: int = -1,
    slow_s: float = 0.0,
) -> pd.DataFrame:
    """Train the unit's MLP ``steps`` steps on ``world_size`` ranks, saving every ``every``
    steps into ``root`` (default: a temporary folder, removed at the end), resuming from the
    latest checkpoint there if any. Under torchrun, in the first attempt, rank ``kill_rank``
    kills itself (SIGKILL) after step ``kill_step`` (-1: never); ``slow_rank`` (-1: none) sleeps
    ``slow_s`` per step (a straggler). Rows (rank 0, this attempt's steps): step, loss, attempt.
    Every event of every rank is logged in ``root/timeline.jsonl`` (:func:`read_timeline`)."""
    steps = validate.count("steps", steps, minimum=1)
    every = validate.count("every", every, minimum=1)
    validate.count("kill_step", kill_step, minimum=-1, maximum=steps)
    validate.count("kill_rank", kill_rank, maximum=world_size - 1)
    validate.count("slow_rank", slow_rank, minimum=-1, maximum=world_size - 1)  # -1: none
    validate.number("slow_s", slow_s, minimum=0.0, finite=True)
    validate.choice("world_size", world_size, (1, 2, 4))
    res = course_lib.launch(
        _elastic_rank,
        world_size,
        steps=steps,
        every=every,
        kill_step=kill_step,
        kill_rank=kill_rank,
        root=str(root),
        slow_rank=slow_rank,
        slow_s=float(slow_s),
    )
    return kit.frame(res[0], LossRow)


def read_timeline(root: str | os.PathLike) -> pd.DataFrame:
    """Every event the ranks logged in ``root``: t (seconds from the first event), rank,
    attempt, event (start, loaded, step, saved, killed, done), step, loss, work_s, step_s."""
    lines = (pathlib.Path(root) / TIMELINE).read_text().splitlines()
    df = kit.frame([EventRow(**json.loads(line)) for line in lines if line.strip()], EventRow)
    if df["error"].isna().all():  # no rank lost a peer
        df = df.drop(columns="error")
    df["t"] = df["t"] - df["t"].min()
    return df.sort_values("t", kind="stable").reset_index(drop=True)


def restart_summary(timeline: pd.DataFrame) -> dict:
    """What the failure cost, from a timeline with a kill: seconds from the kill to the restarted
    ranks' start and to the checkpoint loaded (R, measured), steps redone (work lost), and the
    step the run resumed at."""
    killed = timeline[timeline.event == "killed"].iloc[0]
    second = timeline[timeline.attempt == killed.attempt + 1]
    start = second[second.event == "start"]["t"].max()
    loaded = second[second.event == "loaded"]
    resumed = int(loaded["step"].iloc[0]) if len(loaded) else 0
    return {
        "killed after step": int(killed.step),
        "resumed from step": resumed,
        "steps redone": int(killed.step) - resumed,
        "detect + restart s": float(start - killed.t),
        "restart + load s (R)": float((loaded["t"].max() if len(loaded) else start) - killed.t),
    }


def torchrun_elastic(
    workdir: str | os.PathLike,
    *,
    nproc: int = 2,
    steps: int = 12,
    every: int = 4,
    kill_step: int = 6,
    timeout: float = 120.0,
) -> dict:
    """Export ``u18.elastic`` to ``workdir/elastic.py`` and run it under one torchrun agent with
    ``--max-restarts 1``; rank 1 kills itself after ``kill_step`` in the first attempt. Returns
    the agent's return code, stdout/stderr tails, the results (rank 0's losses of the last
    attempt) and the timeline."""
    from course_lib import cluster
    from course_lib.cluster.local import run_agents, torchrun_command

    work = pathlib.Path(workdir)
    root = work / "checkpoints"
    shutil.rmtree(root, ignore_errors=True)
    script = cluster.export(
        "u18.elastic",
        work / "elastic.py",
        steps=steps,
        every=every,
        kill_step=kill_step,
        root=str(root.resolve()),
    )
    cmd = torchrun_command(
        "--standalone",
        "--nproc-per-node",
        str(nproc),
        "--max-restarts",
        "1",
        "--monitor-interval",
        "0.2",
        script.name,
    )
    started = time.time()
    [proc] = run_agents([cmd], work, timeout=timeout)
    out = {
        "returncode": proc.returncode,
        "wall_s": time.time() - started,
        "stdout": proc.stdout[-3000:],
        "stderr": proc.stderr[-3000:],
    }
    results = work / "elastic_results.json"
    out["losses"] = cluster.load(results).value if results.is_file() else None
    out["timeline"] = read_timeline(root) if (root / TIMELINE).is_file() else None
    return out
