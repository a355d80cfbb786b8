"""What one persistent rank did with one request, as the kernel sees it: :class:`RankReply`.

Part of :class:`~course_lib.runtime.rankset.RankSet` (the ``%%ranks`` magic of
:mod:`course_lib.ranks`, which prints replies and raises for failed ones).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from course_lib.runtime.errors import LaunchError
from course_lib.runtime.protocol import CellReply, Definition

Status = Literal["running", "ok", "error", "interrupted", "timeout", "died", "killed"]
StopReason = Literal["interrupted", "timeout", "peer died"]
Definitions = Iterable[Definition] | dict[int, Iterable[Definition]]  # for all ranks, or by rank


@dataclass
class RankReply:
    """What one rank did with one request (filled in while the kernel waits for it)."""

    status: Status = "running"
    value: Any = None  # repr of the last expression (a cell), or the cloudpickled value (gather)
    stdout: str = ""  # what the rank printed during the request
    stderr: str = ""
    error: str = ""  # what went wrong, with the traceback
    exc_type: str = ""  # the exception's class name, when the request raised
    notes: list[str] = field(default_factory=list)  # kernel definitions that failed in the rank
    seconds: float = 0.0  # how long the request ran in the rank
    stop_reason: StopReason | None = None  # why the kernel interrupted it, if it did
    stack: str = ""  # its Python stack at the deadline (status "timeout")
    deadline: float = 0.0  # the request's timeout, in seconds (status "timeout")
    dead_peers: list[int] = field(default_factory=list)  # stop_reason "peer died": which died

    def record(self, reply: CellReply) -> None:
        """Take the rank's own answer: its value, or its error (an interrupt as such)."""
        self.notes = reply.notes
        if reply.kind == "ok":
            self.status, self.value, self.seconds = "ok", reply.value, reply.seconds
            return
        self.status = "error"
        if reply.exc_type == "KeyboardInterrupt":
            self.status = "timeout" if self.stop_reason == "timeout" else "interrupted"
        self.error = f"raised {reply.exc_type}: {reply.message}\n{reply.traceback.rstrip()}"
        if self.status == "interrupted" and self.stop_reason == "peer died":
            self.error = (
                f"was still running the cell when {_ranks_text(self.dead_peers)} died: "
                f"interrupted, its cell stopped\n{reply.traceback.rstrip()}"
            )
        self.exc_type = reply.exc_type

    def killed(self, timeout: float, grace_s: float) -> None:
        """The rank did not stop within ``grace_s`` of being interrupted: it is killed."""
        why = (
            f"still running at the deadline (timeout={timeout:g} s), then "
            if self.stop_reason == "timeout"
            else ""
        )
        self.status = "killed"
        if self.stop_reason == "peer died":
            self.error = (
                f"was still running the cell when {_ranks_text(self.dead_peers)} died, then did "
                f"not stop within {grace_s:g} s of being interrupted (stuck in C++, e.g. "
                "waiting in a collective for the rank that died): killed"
            )
            return
        self.error = (
            f"{why}did not stop within {grace_s:g} s of being interrupted (stuck in C++, "
            "e.g. waiting in a collective for a rank that is not in it): killed"
        )

    def failure_text(self) -> str:
        """What went wrong, for an error message (the stack at the deadline included)."""
        text = self.error or f"ended with status {self.status}"
        if self.status == "timeout":
            text = (
                f"still running at the deadline (timeout={self.deadline:g} s): interrupted\n{text}"
            )
        if self.stack:
            text += f"\nits Python stack at the deadline:\n{self.stack}"
        return text


def _ranks_text(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {sorted(ranks)}"


def describe_exit(exitcode: int) -> str:
    """How a rank process ended, in words (a signal by name)."""
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"was killed by signal {name} (exit code {exitcode})"
    return f"exited with code {exitcode}"


def failures(replies: dict[int, RankReply]) -> dict[int, str]:
    """rank -> failure text, for the replies that are not ``ok``."""
    return {r: rep.failure_text() for r, rep in replies.items() if rep.status != "ok"}


def failure_error(headline: str, failed: dict[int, str]) -> LaunchError:
    """``headline``, then each failed rank's full text."""
    lines = [headline] + [f"--- rank {r} {t}" for r, t in sorted(failed.items())]
    return LaunchError("\n".join(lines), failed)


def definitions_for(definitions: Definitions, rank: int) -> tuple[Definition, ...]:
    if isinstance(definitions, dict):
        return tuple(definitions.get(rank, ()))
    return tuple(definitions)


@dataclass
class ReplyWait:
    """The state of one wait for replies (``RankSet._collect``): who has not answered, and since when to stop."""

    pending: set[int]
    deadline: float
    replies: dict[int, RankReply]
    grace_s: float  # after an interrupt, a failure or the deadline: time a rank gets to stop
    stopping_since: float | None = None  # when the remaining ranks were interrupted
    first_failure: float | None = None
    dead: set[int] = field(default_factory=set)

    def reason_to_stop(self, now: float, interrupted: bool) -> StopReason | None:
        if interrupted:
            return "interrupted"
        if now >= self.deadline:
            return "timeout"
        if self.first_failure and now >= self.first_failure + self.grace_s:
            return "interrupted"
        return None

    def peer_died(self, now: float) -> set[int]:
        """A rank died: the ranks still running are to be interrupted for it (returned)."""
        for rank in self.pending:
            self.replies[rank].stop_reason = "peer died"
            self.replies[rank].dead_peers = sorted(self.dead)
        self.stopping_since = now
        return self.pending

    def limit(self) -> float:
        if self.stopping_since:
            return self.stopping_since + self.grace_s
        if self.first_failure:
            return min(self.deadline, self.first_failure + self.grace_s)
        return self.deadline


class OutputTail:
    """What each rank's captured stdout/stderr gained since :meth:`mark` (one request's output)."""

    def __init__(self) -> None:
        self._offsets: dict[tuple[int, str], int] = {}

    def mark(self, rank: int, kind: str, path: str) -> None:
        self._offsets[rank, kind] = os.path.getsize(path) if os.path.exists(path) else 0

    def read(self, rank: int, kind: str, path: str) -> str:
        try:
            with open(path, "rb") as f:
                f.seek(self._offsets.get((rank, kind), 0))
                data = f.read()
        except OSError:
            return ""
        self._offsets[rank, kind] = self._offsets.get((rank, kind), 0) + len(data)
        return data.decode("utf-8", errors="replace")
