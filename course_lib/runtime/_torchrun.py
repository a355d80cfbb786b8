"""``course_lib.launch`` inside a torchrun job: this process already is one rank, so run ``fn`` here
and all-gather every rank's outcome. Part of :func:`course_lib.launch` (runtime/launch.py).
"""

from __future__ import annotations

import atexit
import os
import traceback
import warnings
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from course_lib.runtime import compat
from course_lib.runtime._outcomes import Outcome
from course_lib.runtime.device import group_backend, resolve_backend
from course_lib.runtime.errors import LaunchError

# Variables a DDP tutorial sets by hand; only under torchrun (TORCHELASTIC_RUN_ID) do they mean
# that this process is already one rank of a job.
_TUTORIAL_VARIABLES = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
)


def _under_torchrun() -> bool:
    """Whether this process is one rank of a torchrun job. TORCHELASTIC_RUN_ID is set by
    torchrun (torch.distributed.run / elastic) alone; RANK and WORLD_SIZE are often set by hand."""
    env = os.environ
    return "TORCHELASTIC_RUN_ID" in env and "RANK" in env and "WORLD_SIZE" in env


def _warn_about_tutorial_variables(world_size: int) -> None:
    """Variables a DDP tutorial sets, present outside torchrun: say they are ignored."""
    found = [f"{name}={os.environ[name]}" for name in _TUTORIAL_VARIABLES if name in os.environ]
    if not found:
        return
    warnings.warn(
        f"launch ignored {', '.join(found)} from os.environ: this process does not run under "
        "torchrun (TORCHELASTIC_RUN_ID is not set), so launch starts its own "
        f"{world_size} rank{'s' if world_size > 1 else ''} and gives each its own RANK, "
        "WORLD_SIZE, LOCAL_RANK and rendezvous. If they were copied from a DDP tutorial, remove "
        "them (os.environ.pop(name)); to run as torchrun's ranks, start a script with torchrun.",
        UserWarning,
        stacklevel=3,
    )


def _destroy_default_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def _init_default_group(backend: str, timeout: timedelta) -> None:
    """env:// rendezvous; in an attempt torchrun restarted (``--max-restarts``), under a key prefix
    of its own: the agent's store still holds the failed attempt's keys (gloo's addresses of ranks
    that are gone among them), and a new rank reading one of those cannot connect."""
    backend = group_backend(backend)
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    if attempt == 0 or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        dist.init_process_group(backend, timeout=timeout)
        return
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timeout
    )
    dist.init_process_group(
        backend,
        store=dist.PrefixStore(f"course_attempt_{attempt}", store),
        rank=int(os.environ["RANK"]),
        world_size=int(os.environ["WORLD_SIZE"]),
        timeout=timeout,
    )


def _launch_in_torchrun(
    fn: Callable[..., Any],
    world_size: int,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    backend: str,
    timeout: float,
) -> list[Any]:
    """This process is one rank of a torchrun job: run fn here, all-gather the results."""
    env_world = int(os.environ["WORLD_SIZE"])
    if world_size != env_world:
        raise ValueError(
            f"world_size = {world_size}: expected {env_world}, this torchrun job's "
            f"WORLD_SIZE={env_world} (torchrun sets the world size; or call launch outside "
            "torchrun)"
        )
    rank = int(os.environ["RANK"])
    compat.provide_new_collective_names()  # also when the script made its own group
    if not dist.is_initialized():
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", env_world))
        resolved = resolve_backend(backend, local_world)  # one GPU per rank *on this node*
        if resolved == "nccl":
            import torch

            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        _init_default_group(resolved, timedelta(seconds=timeout))
        # Kept for the rest of this process (torchrun made it a rank for life): destroying and
        # re-creating the default group inside one torchrun job reuses torchrun's store keys
        # and can race. It is destroyed when the script exits.
        atexit.register(_destroy_default_group)
    try:
        record = Outcome("ok", fn(rank, world_size, *args, **kwargs))
    except Exception as exc:
        text = f"raised {type(exc).__name__}: {exc}\n{traceback.format_exc().rstrip()}"
        record = Outcome("error", text=text)
    gathered: list[Outcome] = [record] * world_size
    dist.all_gather_object(gathered, record)  # every rank learns every outcome
    failures = {r: rec.text for r, rec in enumerate(gathered) if rec.kind == "error"}
    if failures:
        summary = {
            r: ("returned normally" if rec.kind == "ok" else rec.text.splitlines()[0])
            for r, rec in enumerate(gathered)
        }
        lines = [f"{len(failures)} of {world_size} ranks failed (under torchrun)."]
        lines += [f"rank {r}: {s}" for r, s in summary.items()]
        lines += [f"\n--- rank {r} {text}" for r, text in failures.items()]
        raise LaunchError("\n".join(lines), failures, summary)
    return [rec.value for rec in gathered]
