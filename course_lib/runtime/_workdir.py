"""Each launch's private directory (results, captured output, the rendezvous file), and the
reclaiming of directories whose owner died. Part of :func:`course_lib.launch` (runtime/launch.py).
"""

from __future__ import annotations

import os
import shutil
import tempfile

import psutil

_WORKDIR_PREFIX = "course_lib_launch_pid"  # + "<caller pid>_<random>" in the temporary directory


def _new_workdir() -> str:
    return tempfile.mkdtemp(prefix=f"{_WORKDIR_PREFIX}{os.getpid()}_")


def _workdir_owner(name: str) -> int | None:
    """The pid in ``course_lib_launch_pid<pid>_<random>``, or None for any other name."""
    if not name.startswith(_WORKDIR_PREFIX):
        return None
    pid, sep, _ = name[len(_WORKDIR_PREFIX) :].partition("_")
    return int(pid) if sep and pid.isdigit() else None


def _owner_alive(pid: int, path: str) -> bool:
    try:
        owner = psutil.Process(pid)
        if owner.status() == psutil.STATUS_ZOMBIE:
            return False
        # a process started after the directory last changed only reuses the dead owner's pid
        return bool(owner.create_time() <= os.stat(path).st_mtime + 1.0)
    except psutil.NoSuchProcess:
        return False
    except (psutil.Error, OSError):
        return True  # cannot tell: leave it


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
