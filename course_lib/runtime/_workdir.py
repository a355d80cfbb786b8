"""Each launch's private directory (results, captured output, the rendezvous file), and the
reclaiming of directories whose owner died. Part of :func:`course_lib.launch` (runtime/launch.py)
and the persistent ranks (runtime/rankset.py).

Who owns a directory is decided by a lock, not by a pid and a time: the owner holds an exclusive
``flock`` on the directory's ``owner.lock`` from the moment the directory exists until it removes
it, and the kernel drops the lock when the owner exits, however it exits. A directory whose lock
can be taken has no live owner. A clock step cannot fool this (a pid compared with timestamps
could: it deleted a live launch's directory, and its printed output with it), nor can a pid
reused by an unrelated process.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

import psutil

_WORKDIR_PREFIX = "course_lib_launch_pid"  # + "<caller pid>_<random>" in the temporary directory
_LOCK_NAME = "owner.lock"
_held: dict[str, int] = {}  # workdir -> the descriptor holding its lock (released on removal)


def _new_workdir() -> str:
    """A new private directory, locked by this process until :func:`_remove_workdir`."""
    path = tempfile.mkdtemp(prefix=f"{_WORKDIR_PREFIX}{os.getpid()}_")
    if sys.platform != "win32":
        import fcntl

        # locked under a temporary name first: a reclaimer never sees an unlocked owner.lock
        pending = os.path.join(path, _LOCK_NAME + ".new")
        fd = os.open(pending, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.rename(pending, os.path.join(path, _LOCK_NAME))
        _held[path] = fd
    return path


def _remove_workdir(path: str) -> None:
    """Remove a directory made by :func:`_new_workdir`, then release its lock."""
    shutil.rmtree(path, ignore_errors=True)
    fd = _held.pop(path, None)
    if fd is not None:
        os.close(fd)


def _workdir_owner(name: str) -> int | None:
    """The pid in ``course_lib_launch_pid<pid>_<random>``, or None for any other name."""
    if not name.startswith(_WORKDIR_PREFIX):
        return None
    pid, sep, _ = name[len(_WORKDIR_PREFIX) :].partition("_")
    return int(pid) if sep and pid.isdigit() else None


def _owner_alive(pid: int, path: str) -> bool:
    """Whether the directory's owner still holds its lock. Without a lock file (a platform
    without flock, or a directory made before locks): whether a process ``pid`` exists at all
    (a reused pid keeps a stale directory; it never removes a live one)."""
    if sys.platform == "win32":
        return bool(psutil.pid_exists(pid))
    import fcntl

    try:
        fd = os.open(os.path.join(path, _LOCK_NAME), os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return bool(psutil.pid_exists(pid))
    except OSError:
        return True  # cannot tell: leave it
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # BlockingIOError: held by its owner
        return True
    finally:
        os.close(fd)
    return False


def _reclaim_stale_workdirs() -> None:
    """Remove work directories whose owning process is gone (a kernel restarted, or killed,
    during a launch). Directories of live callers, other users' and unrelated ones stay."""
    root = tempfile.gettempdir()
    try:
        names = os.listdir(root)
    except OSError:
        return
    uid = os.getuid() if hasattr(os, "getuid") else None
    for name in names:
        pid = _workdir_owner(name)
        if pid is None or pid == os.getpid():
            continue
        path = os.path.join(root, name)
        try:
            if uid is not None and os.stat(path).st_uid != uid:
                continue
        except OSError:
            continue
        if not _owner_alive(pid, path):
            shutil.rmtree(path, ignore_errors=True)
