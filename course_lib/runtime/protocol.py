"""What travels between the caller and its ranks: the rank spec, a rank's result record, the
requests and replies of a persistent rank. Plain frozen dataclasses, pickled across the process
boundary; standard library only, since the forkserver preloads this module with the trampoline.

Part of :func:`course_lib.launch` (runtime/launch.py) and the persistent ranks behind ``%%ranks``
(runtime/rankset.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Backend = Literal["gloo", "nccl"]  # what a rank runs (``"auto"`` is resolved by the caller)
BackendChoice = Literal["auto", "gloo", "nccl"]  # what a caller asks for
StartMethod = Literal["fork", "forkserver", "spawn"]


@dataclass(frozen=True)
class RankSpec:
    """Everything a rank needs to start, the same for every rank of one launch or rank set."""

    world_size: int  # number of ranks
    backend: Backend  # the process group's backend, already resolved
    timeout: float  # seconds: the process group's collective timeout (and launch's deadline)
    threads: int  # intra-op threads per rank (torch.set_num_threads)
    workdir: str  # the private directory: captured output, results, the FileStore
    env: dict[str, str]  # the caller's environment, as it is at the launch
    sys_path: list[str]  # the caller's import path, '' resolved to its current directory
    child_start_method: str | None  # for a rank's own multiprocessing children (None: default)
    loopback_interface: str | None  # for gloo (GLOO_SOCKET_IFNAME), or None: gloo picks
    payload: bytes = b""  # launch only: cloudpickled (fn, args, kwargs)


@dataclass(frozen=True)
class RankResult:
    """What a launched rank's trampoline writes: its return value, or the exception it raised."""

    kind: Literal["ok", "error"]
    when: float  # time.time() when it returned or raised
    value: Any = None  # kind "ok": fn's return value
    exc_type: str = ""  # kind "error": the exception's class name, message and traceback
    message: str = ""
    traceback: str = ""

    @property
    def error_text(self) -> str:
        """``raised Type: message`` and the traceback (kind "error")."""
        return f"raised {self.exc_type}: {self.message}\n{self.traceback.rstrip()}"


Definition = tuple[str, str, str]  # (label, source, filename) of a kernel definition

# The names every persistent rank defines for itself. A notebook value of one of these names never
# replaces the rank's own (a literal ``rank = 0`` in the notebook would make every rank rank 0).
RANK_NAMES = {
    "rank": "its own rank number",
    "world_size": "the number of ranks in the set",
    "device": "its own device",
    "dist": "torch.distributed",
    "torch": "the torch module",
}


@dataclass(frozen=True)
class Request:
    """One request to a persistent rank: run a cell, evaluate an expression, define names, stop.

    ``exec`` runs ``source`` (a cell) and answers the repr of its last expression; ``eval``
    evaluates ``source`` and answers the cloudpickled value; ``push`` defines the cloudpickled
    ``{name: value}`` in ``values``. ``definitions`` run first (exec and eval)."""

    kind: Literal["exec", "eval", "push", "stop"]
    source: str = ""
    filename: str = "<ranks cell>"
    definitions: tuple[Definition, ...] = ()
    values: bytes = b""


@dataclass(frozen=True)
class CellReply:
    """A persistent rank's answer to one request (kind "error": the request raised)."""

    kind: Literal["ok", "error"]
    value: Any = None  # exec: repr of the last expression or None; eval: cloudpickled value
    notes: list[str] = field(default_factory=list)  # definitions that failed here
    exc_type: str = ""
    message: str = ""
    traceback: str = ""
    seconds: float = 0.0  # how long the request took in the rank
