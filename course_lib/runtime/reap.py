"""Leave no process behind: find every descendant of a process and kill it.

Used where the grader shuts a learner's kernel down (``grading/grader.py``): whatever an answer
started must not outlive its grading. A descendant is found through its parent pid in ``/proc``
(Linux), so one that moved to its own session or process group (``start_new_session=True``,
``setsid``, a daemon) is found too; a kill of the kernel's process group would miss it.

A process whose parent exits is re-parented to the nearest "child subreaper" (or init): once
the kernel has exited, its orphans are no longer its descendants. :func:`no_process_left` makes
the calling process that subreaper for the duration of a block (``prctl(PR_SET_CHILD_SUBREAPER)``),
so every process started inside the block, orphaned or not, is still found and killed at its end.

    with no_process_left():              # the grader: around the kernel's whole lifetime
        with client.setup_kernel(): ...
    kill_descendants(pid)                # or directly: every descendant of pid, then wait
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import time
from collections.abc import Iterator

__all__ = [
    "collect",
    "collect_orphans",
    "descendants",
    "in_session",
    "kill_descendants",
    "no_process_left",
]

_PR_SET_CHILD_SUBREAPER = 36
_PR_GET_CHILD_SUBREAPER = 37


def _stats() -> Iterator[tuple[int, list[bytes]]]:
    """(pid, the fields of /proc/pid/stat after its name: state ppid pgrp session ...) of every
    process (those that vanish meanwhile are skipped)."""
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses; it ends at the last ')'
        yield int(entry), stat[stat.rfind(b")") + 2 :].split()


def _parents() -> dict[int, int]:
    """pid -> parent pid of every process in /proc."""
    return {pid: int(fields[1]) for pid, fields in _stats()}


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` by parent pid, in any session or process group
    (children before their own children). Empty where there is no /proc."""
    if not os.path.isdir("/proc"):
        return []
    children: dict[int, list[int]] = {}
    for child, parent in _parents().items():
        children.setdefault(parent, []).append(child)
    found: list[int] = []
    todo = [pid]
    while todo:
        for child in sorted(children.get(todo.pop(0), [])):
            found.append(child)
            todo.append(child)
    return found


def _running(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 :].split()[0] not in (b"Z", b"X")


def _reap(pids: list[int]) -> None:
    """Collect the exit status of those of ``pids`` that are this process's children."""
    for pid in pids:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)


def collect(pids: list[int], timeout: float = 1.0) -> None:
    """Reap those of ``pids`` (processes this process killed) that have become its children.

    A process killed together with its parent is re-parented to the nearest subreaper: this
    process, inside :func:`no_process_left`. It is a zombie by then, which the block's kill pass
    skips (it is not running), and it would stay this process's child for good. One whose parent
    is still dying is waited for (up to ``timeout`` s) until it comes here. Only the pids given
    are waited for, never a child someone else (a ``Popen``) will wait for."""
    deadline = time.monotonic() + timeout
    me, given = os.getpid(), set(pids)
    left = list(pids)
    while left:
        _reap(left)
        waiting = []
        for p in left:
            parent = _parent(p)
            if parent is None:
                continue  # gone: reaped
            if parent == me or parent in given or not _running(parent):
                waiting.append(p)  # ours and not reaped yet, or its parent is dying
        left = waiting
        if not left or time.monotonic() >= deadline:
            return
        time.sleep(0.02)


def collect_orphans() -> list[int]:
    """Reap this process's zombie children that came here as orphans (this process was their
    subreaper) and exited on their own: a kill pass skips a process that is no longer running,
    and no one else will ever wait for it. A kernel's forkserver is one: its kernel shut down, it
    came here, and it exited before the kill pass. An orphan is told from a child started here
    (which its ``Popen`` or ``fork`` caller will wait for) by its session: an orphan keeps that of
    the tree it came from, neither this process's nor one it leads itself (a child started here
    runs in this session or, ``start_new_session``/``setsid``, leads its own). The pids reaped."""
    me, mine = os.getpid(), os.getsid(0)
    reaped = []
    for pid, fields in _stats():
        state, parent, sid = fields[0], int(fields[1]), int(fields[3])
        if parent == me and state == b"Z" and sid not in (mine, pid):
            with contextlib.suppress(ChildProcessError, OSError):
                if os.waitpid(pid, os.WNOHANG)[0] == pid:
                    reaped.append(pid)
    return reaped


def in_session(sid: int) -> list[int]:
    """Every process (zombies too) whose session id is ``sid``: what a process started with
    ``start_new_session=True`` and its descendants started, also ones killed after a listing."""
    return [pid for pid, fields in _stats() if int(fields[3]) == sid]


def _parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    return int(stat[stat.rfind(b")") + 2 :].split()[1])


def kill_descendants(
    pid: int, *, keep: frozenset[int] = frozenset(), timeout: float = 5.0
) -> list[int]:
    """SIGKILL every descendant of ``pid`` except ``keep`` (and theirs), again until none is
    left (one may fork meanwhile), and wait up to ``timeout`` s for them to be gone.
    Returns the pids killed."""
    killed: list[int] = []
    deadline = time.monotonic() + timeout
    while True:
        found = [p for p in _outside(descendants(pid), keep) if _running(p)]
        for child in found:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(child, signal.SIGKILL)
        killed += [p for p in found if p not in killed]
        _reap(killed)
        if not found or time.monotonic() >= deadline:
            break
        time.sleep(0.02)
    while any(_running(p) for p in killed) and time.monotonic() < deadline:
        time.sleep(0.02)
        _reap(killed)
    return killed


def _outside(pids: list[int], keep: frozenset[int]) -> list[int]:
    """``pids`` less ``keep`` and every descendant of a kept one."""
    if not keep:
        return pids
    kept = set(keep)
    for p in keep:
        kept.update(descendants(p))
    return [p for p in pids if p not in kept]


def _subreaper(on: bool | None = None) -> bool | None:
    """Set (``on``) or read this process's child-subreaper flag; None where prctl is missing."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if on is not None:
            return libc.prctl(_PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) == 0 or None
        value = ctypes.c_int(0)
        if libc.prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(value), 0, 0, 0) != 0:
            return None
        return bool(value.value)
    except (OSError, AttributeError):
        return None


@contextlib.contextmanager
def no_process_left(timeout: float = 5.0) -> Iterator[None]:
    """Kill, at the end of the block, every process started inside it and still running, also
    orphans and ones in their own session (this process is their subreaper meanwhile), and reap
    the orphans that exited on their own (:func:`collect_orphans`). Processes that were already
    this process's descendants when the block began are left alone."""
    before = frozenset(descendants(os.getpid()))
    previous = _subreaper()
    if previous is False:
        _subreaper(True)
    try:
        yield
    finally:
        try:
            collect(kill_descendants(os.getpid(), keep=before, timeout=timeout))
            collect_orphans()
        finally:
            if previous is False:
                _subreaper(False)
