"""What happened on each rank, read back by the caller: results, errors, deaths, hangs, and the
:class:`~course_lib.LaunchError` that names them; each rank's captured output printed in rank
order. Part of :func:`course_lib.launch` (runtime/launch.py).
"""

from __future__ import annotations

import math
import pickle
import signal
import sys
import time
from dataclasses import dataclass
from typing import Any, Literal

from course_lib.runtime import _worker
from course_lib.runtime.errors import LaunchError
from course_lib.runtime.protocol import RankResult

_STDERR_TAIL_LINES = 15  # lines of a dead rank's stderr quoted in the error


@dataclass(frozen=True)
class Outcome:
    """How one rank of a launch ended, as the caller sees it.

    ``ok``: it returned ``value`` (``text``: a note, e.g. it was stopped while waiting for its
    peers); ``error``: it raised, died or hung (``text`` says which, ``when`` is when, for
    ordering failures); ``stopped``: the launcher stopped it after a peer failed (``text``)."""

    kind: Literal["ok", "error", "stopped"]
    value: Any = None
    text: str = ""
    when: float = math.inf

    @classmethod
    def from_result(cls, record: RankResult, note: str = "") -> Outcome:
        if record.kind == "ok":
            return cls("ok", record.value, note)
        return cls("error", text=record.error_text, when=record.when)


def read_result(workdir: str, rank: int) -> RankResult | None:
    """The record a rank's trampoline wrote, or None if it wrote none."""
    try:
        with open(_worker.rank_file(workdir, rank, "result"), "rb") as f:
            record: RankResult = pickle.load(f)
            return record
    except FileNotFoundError:
        return None


def _size(n: float) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def read_outcome(
    workdir: str, rank: int, exitcode: int, memory: tuple[int, int, int] | None = None
) -> Outcome:
    """Outcome of a rank whose process has exited with ``exitcode``; ``memory`` is its last
    noted (resident bytes, system available bytes, system total bytes)."""
    record = read_result(workdir, rank)
    if record is not None:
        return Outcome.from_result(record)
    text = _exit_text(exitcode, memory)
    tail = (
        read_text(_worker.rank_file(workdir, rank, "err"))
        .rstrip()
        .splitlines()[-_STDERR_TAIL_LINES:]
    )
    if tail:
        text += "\nlast lines of its stderr:\n" + "\n".join(tail)
    return Outcome("error", text=text, when=time.time())


def _exit_text(exitcode: int, memory: tuple[int, int, int] | None) -> str:
    """Why a rank that wrote no result ended: a signal (the OOM killer's, likely) or an exit."""
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        text = f"was killed by signal {name} (exit code {exitcode})"
        if exitcode == -getattr(signal, "SIGKILL", 9):  # (Windows has no SIGKILL constant)
            # The launcher sends SIGKILL only to ranks whose outcome is already known, so this
            # one came from elsewhere: most often the kernel's out-of-memory killer.
            text += (
                ", out of memory? The launcher did not send it; the system's "
                "out-of-memory killer is the usual sender"
            )
            if memory is not None:
                rss, available, total = memory
                text += (
                    f" (it was last seen using {_size(rss)}, when {_size(available)} of "
                    f"{_size(total)} were available)"
                )
    else:
        text = (
            f"exited with code {exitcode} before returning a result (if the caller is a "
            "script, keep the launch under `if __name__ == '__main__':`, as multiprocessing "
            "re-imports the main module in every rank)"
        )
    return text


# What a rank's collective reports when a *peer* died or failed first.
_PEER_FAILURE_MARKERS = (
    "Connection closed by peer",
    "Connection reset by peer",
    "NCCL communicator was aborted",
    "Broken pipe",
)


def launch_error(outcomes: dict[int, Outcome]) -> LaunchError:
    """The error naming every rank of a failed launch, the root cause first."""
    failures = {r: o.text for r, o in outcomes.items() if o.kind == "error"}

    def consequence(rank: int) -> bool:  # failed only because a peer went away
        return any(m in failures[rank].split("\n", 1)[0] for m in _PEER_FAILURE_MARKERS)

    # the root cause: a failure that is not a peer's consequence, earliest first
    first = min(failures, key=lambda r: (consequence(r), outcomes[r].when, r))
    summary = {}
    for rank, outcome in sorted(outcomes.items()):
        if outcome.kind == "ok":
            summary[rank] = outcome.text or "returned normally"
        elif outcome.kind == "stopped":
            summary[rank] = outcome.text
        else:
            line = outcome.text.split("\n", 1)[0]
            line = line if len(line) <= 160 else line[:157] + "..."
            if consequence(rank) and rank != first:
                line += f" (a consequence: a peer left the collective, see rank {first})"
            summary[rank] = line
    returned = sorted(r for r, o in outcomes.items() if o.kind == "ok")
    waited = any(o.kind == "stopped" for o in outcomes.values()) or any(
        "timed out" in f.lower() or "timeout" in f.lower() for f in failures.values()
    )
    lines = [f"{len(failures)} of {len(outcomes)} ranks failed (first: rank {first})."]
    lines += [f"rank {r}: {s}" for r, s in summary.items()]
    if returned and waited:  # the classic hang: one rank left, its peers waited for it
        lines.append(
            f"hint: ranks {returned} returned while others failed or waited; a rank that "
            "skips a collective (or calls a different one) leaves its peers waiting"
        )
    order = sorted(failures, key=lambda r: r != first)  # root cause first, then rank order
    lines += [f"\n--- rank {r} {failures[r]}" for r in order]
    return LaunchError("\n".join(lines), failures, summary)


def read_text(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def emit_output(workdir: str, world_size: int) -> None:
    """Print each rank's captured stdout/stderr into the caller's, prefixed, in rank order."""
    for kind, stream in (("out", sys.stdout), ("err", sys.stderr)):
        text = "".join(
            f"[rank {rank}] {line}\n"
            for rank in range(world_size)
            for line in read_text(_worker.rank_file(workdir, rank, kind)).splitlines()
        )
        if text and stream is not None:  # sys.stdout is None under pythonw
            stream.write(text)
            stream.flush()
