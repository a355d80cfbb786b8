"""Why a checkpoint save or load failed, rank by rank, in the first lines of the error.

DCP gathers the exception of every rank that failed and raises one ``CheckpointException`` on
all of them, whose text starts ``CheckpointException ranks:dict_keys([1])``: on a full disk,
"No space left on device" came 25 lines into a 205-line report. :func:`from_dcp` turns it into
a :class:`CheckpointIOError` whose first lines name each failed rank and its cause::

    rank 1: No space left on device (ENOSPC) writing '/ckpt/step_000008.partial'
    path = '/ckpt/step_000008': not saved; a checkpoint already there is untouched

with DCP's own report kept as its cause (``raise ... from``), tracebacks and all. A step only
rank 0 takes (creating the folder, the final rename) is shared with every rank
(:func:`on_rank0`), so that a rank 0 refused by the file system names its cause on every rank
instead of leaving the others waiting for it at a barrier; so are the checks before a load
(:func:`gather`): a shard one rank cannot see fails the load on every rank, naming that rank,
instead of its peers waiting for it inside DCP's first collective until the time-out.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from typing import Any

import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException

__all__ = ["CheckpointIOError", "by_rank", "cause", "from_dcp", "gather", "on_rank0"]


class CheckpointIOError(RuntimeError):
    """A save or load that failed on some ranks. The message names each failed rank and its
    cause in its first lines; ``failures`` maps rank -> that cause (one line each); the
    exception DCP raised, when it was DCP, is ``__cause__``."""

    def __init__(self, message: str, failures: dict[int, str]) -> None:
        super().__init__(message)
        self.failures = dict(sorted(failures.items()))

    def __reduce__(self) -> tuple[type[CheckpointIOError], tuple[str, dict[int, str]]]:
        return type(self), (self.args[0], self.failures)  # the attributes survive a pickle


def cause(exc: BaseException, doing: str, path: Any) -> str:
    """One line: ``No space left on device (ENOSPC) writing '<file>'`` for an OSError (its own
    file name when it has one, else ``path``), ``Type: first line (writing '<path>')`` else."""
    if isinstance(exc, OSError) and exc.errno is not None:
        name = errno.errorcode.get(exc.errno, f"errno {exc.errno}")
        target = exc.filename if exc.filename is not None else path
        return f"{exc.strerror or os.strerror(exc.errno)} ({name}) {doing} {str(target)!r}"
    first = next(iter(str(exc).splitlines()), "")
    return f"{type(exc).__name__}: {first} ({doing} {str(path)!r})"


def _error(failures: dict[int, str], path: Any, outcome: str) -> CheckpointIOError:
    lines = [f"rank {r}: {c}" for r, c in sorted(failures.items())]
    lines.append(f"path = {str(path)!r}: {outcome}")
    return CheckpointIOError("\n".join(lines), failures)


def from_dcp(
    exc: CheckpointException, doing: str, folder: Any, path: Any, outcome: str
) -> CheckpointIOError:
    """The error naming every rank DCP reports failed (raise it ``from exc``)."""
    failures = {}
    for rank, failure in exc.failures.items():
        local = failure[0] if isinstance(failure, tuple) else failure
        failures[int(rank)] = cause(local, doing, folder)
    return _error(failures, path, outcome)


def gather(group: Any, failure: str | None) -> dict[int, str]:
    """Every rank's failure (rank -> one line), from every rank of ``group``: a collective that
    every rank calls, whether it failed or not (none is left waiting for a peer that raised)."""
    rank = dist.get_rank() if dist.is_initialized() else 0
    failures = {rank: failure} if failure is not None else {}
    if not dist.is_initialized():
        return failures
    gathered: list[dict[int, str] | None] = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, failures, group=group)
    return {r: t for one in gathered for r, t in (one or {}).items()}


def on_rank0(
    group: Any, action: Callable[[], None], doing: str, target: Any, path: Any, outcome: str
) -> None:
    """Run ``action`` on rank 0 of ``group`` (every rank calls this, in place of a barrier);
    if it fails, every rank raises the same :class:`CheckpointIOError` naming rank 0's cause
    (rank 0's from it)."""
    failed: BaseException | None = None
    text = None
    if not dist.is_initialized() or dist.get_rank(group) == 0:
        try:
            action()
        except Exception as exc:  # any failure of rank 0 must reach the others
            failed, text = exc, cause(exc, doing, target)
    failures = gather(group, text)
    if failures:
        raise _error(failures, path, outcome) from failed


def by_rank(failures: dict[int, str]) -> str:
    """``rank 1: <text>`` lines, ranks with the same text on one line (``ranks 0, 1: ...``)."""
    texts: dict[str, list[int]] = {}
    for rank, text in sorted(failures.items()):
        texts.setdefault(text, []).append(rank)
    return "\n".join(
        f"rank{'s' if len(r) > 1 else ''} {', '.join(map(str, r))}: {t}" for t, r in texts.items()
    )
