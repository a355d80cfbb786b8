"""How a ``%%ranks`` cell's replies reach the notebook: each rank's output in rank order, and the
one error a failed or interrupted cell raises. Part of :mod:`course_lib.ranks`.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from course_lib.runtime.errors import LaunchError
from course_lib.runtime.interrupts import Interrupted
from course_lib.runtime.replies import RankReply, failures

if TYPE_CHECKING:  # the ranks run behind it; imported with torch only once a set starts
    from course_lib.runtime.rankset import RankSet


class RanksError(LaunchError):
    """A ``%%ranks`` cell failed on some rank (or a rank died); shown without the kernel's frames.
    A :class:`~course_lib.LaunchError`: ``.failures`` maps each failed rank to what happened."""

    def _render_traceback_(
        self,
    ) -> list[str]:  # IPython shows these lines instead of the magic's own stack
        return [f"RanksError: {self.args[0]}"]


class RanksUsageError(ValueError):
    """Bad input to %ranks / %%ranks: the message says what to type instead."""

    def _render_traceback_(self) -> list[str]:
        return [f"RanksUsageError: {self.args[0]}"]


_RESTART = (
    "a process group cannot go on without one of its ranks. "
    "%ranks restart starts a fresh set (state is lost)"
)


def _prefixed(rank: int, text: str) -> str:
    return "".join(f"[rank {rank}] {line}\n" for line in text.splitlines())


def show(replies: dict[int, RankReply], noted: set[str]) -> None:
    """Print each rank's output, then its last value, rank by rank; notes once each."""
    out = "".join(
        _prefixed(r, rep.stdout)
        + (
            _prefixed(r, f"Out: {rep.value}")
            if rep.status == "ok" and rep.value is not None
            else ""
        )
        for r, rep in sorted(replies.items())
    )
    err = "".join(_prefixed(r, rep.stderr) for r, rep in sorted(replies.items()))
    notes = [n for rep in replies.values() for n in rep.notes if n not in noted]
    for note in dict.fromkeys(notes):
        noted.add(note)
        err += f"[ranks] not defined in the ranks: {note}\n"
    if out:
        sys.stdout.write(out)
        sys.stdout.flush()
    if err:
        sys.stderr.write(err)
        sys.stderr.flush()


def raise_for(replies: dict[int, RankReply], rs: RankSet) -> None:
    """Raise for a cell that failed or was interrupted on some rank (nothing if all are ok)."""
    from course_lib.runtime.rankset import GRACE_S

    bad = {r: rep for r, rep in replies.items() if rep.status != "ok"}
    if not bad:
        return
    statuses = {rep.status for rep in bad.values()}
    if statuses <= {"interrupted"} and rs.alive:
        sys.stderr.write(
            f"[ranks] interrupted: ranks {sorted(bad)} stopped their cell; every rank "
            "keeps its state\n"
        )
        raise Interrupted
    if (
        statuses <= {"interrupted", "killed"}
        and not rs.alive
        and all(rep.stop_reason == "interrupted" for rep in bad.values())
    ):
        # the stop button while some ranks wait in C++ (a collective a stopped rank never joins)
        stopped = sorted(r for r, rep in bad.items() if rep.status == "interrupted")
        killed = sorted(r for r, rep in bad.items() if rep.status == "killed")
        sys.stderr.write(
            "[ranks] interrupted: "
            + (f"ranks {stopped} stopped their cell; " if stopped else "")
            + f"ranks {killed} did not stop within {GRACE_S:g} s (stuck in C++, e.g. "
            "waiting in a collective for a rank that is not in it) and were killed\n"
        )
        raise Interrupted(
            "the ranks were stopped (a process group cannot go on without one of "
            "its ranks): %ranks restart starts a fresh set (state is lost)"
        )
    failed = failures(replies)
    if "died" in statuses:
        raise RanksError(_died_message(replies, failed, rs), failed)
    lines = [f"rank {r}: {failed[r].splitlines()[0]}" for r in sorted(failed)]
    if rs.alive:
        fine = sorted(set(replies) - set(bad))
        tail = (
            f"ranks {fine} finished the cell; " if fine else ""
        ) + "every rank is still running, with its state"
    else:
        tail = f"the ranks were stopped ({rs.ended}): {_RESTART}"
    message = (
        f"{len(bad)} of {len(replies)} ranks failed: "
        + "; ".join(lines)
        + f"\n{tail}\n"
        + "".join(f"\n--- rank {r} {failed[r]}\n" for r in sorted(failed))
    )
    raise RanksError(message, failed)


def _died_message(replies: dict[int, RankReply], failed: dict[int, str], rs: RankSet) -> str:
    """A rank died during the cell: what happened to each rank, then the details."""
    dead = sorted(r for r, rep in replies.items() if rep.status == "died")
    each = "".join(
        f"\n  rank {r}: " + (failed[r].splitlines()[0] if r in failed else "finished the cell")
        for r in sorted(replies)
    )
    died = f"rank {dead[0]}" if len(dead) == 1 else f"ranks {dead}"
    return (
        f"{died} died during the cell. What each rank did:{each}\n"
        f"the ranks were stopped ({rs.ended}): {_RESTART}\n"
        + "".join(f"\n--- rank {r} {failed[r]}\n" for r in sorted(failed))
    )
