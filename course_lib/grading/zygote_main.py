"""What runs inside the grader's zygote (:mod:`course_lib.grading.zygote`, which starts it as
``python -c "from course_lib.grading.zygote_main import main; main()" RESULT_FD UNIT``).

:func:`main` serves each unit from a fork of itself, a *unit process* (:class:`_UnitServer`,
:func:`_serve`), which imports and traps the unit and forks one clean child per task
(:func:`_fork`, :func:`_child`). Requests come on stdin, one per line; replies go out on
RESULT_FD, one line each.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import signal
import sys
import time
from dataclasses import asdict
from pathlib import Path

from course_lib.grading.isolate import CheckJob, CheckResult
from course_lib.runtime.reap import kill_descendants, no_process_left

__all__ = ["main"]


def main() -> None:
    """The zygote: serve the notebook's unit from a fork of it (a request for another unit gets
    a fresh fork)."""
    from course_lib.grading.isolate import _python_source

    result_fd, unit = int(sys.argv[1]), sys.argv[2]
    _ZYGOTE_FDS.append(result_fd)  # closed in every child, before any learner code
    _python_source("")  # IPython's transformer imported before the fork, not in every child
    requests = open(0, "rb", closefd=False)  # noqa: SIM115 - the grader's pipe, for the whole run
    with no_process_left():  # a unit's process and whatever outlived it
        # The unit's process imports what its unit needs itself, nothing more (unit 14's checks
        # need no torch: 3.5 s to grade its solution, not 7). A zygote serves one notebook (its
        # sandbox's): nothing is preloaded here for a next one.
        server = _UnitServer(unit, result_fd)
        for line in requests:  # one request per line, until the grader closes stdin
            jobs = json.loads(line)["jobs"]
            wanted = jobs[0]["unit"] if jobs else server.unit
            if wanted != server.unit:  # a notebook of another unit: a fresh fork for it
                server.close()
                server = _UnitServer(wanted, result_fd)
            reply = server.ask(line)
            if reply is None:  # an answer killed its unit's process: this zygote ends as it did
                break
            _write_all(result_fd, reply)
        status = server.close()
    sys.stdout.flush()
    if status < 0:  # killed by a signal: so is this process, for the grader's message
        signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
    os._exit(max(status, 0))


class _UnitServer:
    """In the zygote: a fork of it that imported one unit and forks that unit's check processes
    (:func:`_serve`); requests go to it on a pipe, its replies come back on another."""

    def __init__(self, unit: str, result_fd: int):
        self.unit = unit
        request_r, request_w = os.pipe()
        reply_r, reply_w = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        self.pid = os.fork()
        if self.pid == 0:
            try:
                os.close(request_w)
                os.close(reply_r)
                os.dup2(request_r, 0)  # its requests come on stdin, as the zygote's do
                os.dup2(reply_w, result_fd)  # and its replies go out on the same fd number
                os.close(request_r)
                os.close(reply_w)
                _serve(unit, result_fd)
            except BaseException:  # noqa: BLE001 - the traceback goes to the grader's log
                import traceback

                traceback.print_exc()
                sys.stderr.flush()
                os._exit(1)
            os._exit(0)
        os.close(request_r)
        os.close(reply_w)
        self._requests = os.fdopen(request_w, "wb")
        self._replies = os.fdopen(reply_r, "rb")

    def ask(self, line: bytes) -> bytes | None:
        """Its reply line to ``line``, or None when it ended without one."""
        try:
            self._requests.write(line if line.endswith(b"\n") else line + b"\n")
            self._requests.flush()
        except OSError:
            return None
        reply = self._replies.readline()
        return reply if reply.endswith(b"\n") else None

    def close(self) -> int:
        """End it (its checks' leftovers die with it) and reap it: its exit status."""
        for stream in (self._requests, self._replies):
            with contextlib.suppress(OSError):
                stream.close()
        deadline = time.monotonic() + 10
        while True:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                return os.waitstatus_to_exitcode(status)
            if time.monotonic() > deadline:
                kill_descendants(self.pid, timeout=5)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGKILL)
                return os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
            time.sleep(0.02)


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data) :]


def _serve(unit: str, result_fd: int) -> None:
    """One unit's process: import and trap the unit, wait for its jobs, fork one child per task."""
    from course_lib.grading.isolate import prepare

    prepare(unit)
    if "torch" in sys.modules:  # a solution outside the course's units that uses torch
        import torch._dynamo  # noqa: F401
    requests = open(0, "rb", closefd=False)  # noqa: SIM115 - a reader of its own, not the zygote's
    with no_process_left():  # orphans of the checks come back here and are killed
        server = _warm_forkserver(unit)
        out = os.fdopen(result_fd, "w", closefd=False)
        for line in requests:
            request = json.loads(line)
            timeout = float(request["timeout"])
            where = (request["seed"], request["cwd"])
            results = [
                asdict(_fork(CheckJob(**spec), timeout, server, where)) for spec in request["jobs"]
            ]
            out.write(json.dumps(results) + "\n")
            out.flush()
    sys.stdout.flush()


#: the zygote's own channel to the grader: a child that kept it could write a forged verdict for
#: every task of the notebook (and, in a batch, of the next notebooks the zygote serves)
_ZYGOTE_FDS: list[int] = []

_LAUNCHES = re.compile(r"\b(launch|launch_learner|RankSet)\(")


def _warm_forkserver(unit: str) -> int | None:
    """Start the launcher's forkserver now if ``unit``'s checks launch ranks; its pid, else None."""
    import importlib.util
    import multiprocessing.forkserver

    try:
        spec = importlib.util.find_spec(unit)
    except ImportError:  # a unit the course does not have (a test's fixture): no checks to read
        return None
    if spec is None or not spec.origin:
        return None
    folder = Path(spec.origin).parent
    if not any(_LAUNCHES.search(p.read_text()) for p in folder.glob("checks*.py")):
        return None
    # imported only now: it imports torch (~2 s of CPU), which a unit whose checks launch no rank
    # (or a torch-free one, as the grading tests' fixture) never needs here
    from course_lib.runtime import processes

    # a fork of this process (torch and the unit imported, one thread): no second interpreter
    if not processes.start_forkserver_by_fork() and processes.start_method() != "forkserver":
        return None
    return getattr(multiprocessing.forkserver._forkserver, "_forkserver_pid", None)


def _fork(job: CheckJob, timeout: float, server: int | None, where: tuple[str, str]) -> CheckResult:
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the task's clean process, with its notebook's seed and folder
        os.close(read_fd)
        os.environ["COURSE_GRADE_SEED"], folder = where
        os.chdir(folder)
        _child(job, write_fd)
    os.close(write_fd)
    chunks, deadline = [], time.monotonic() + timeout
    with os.fdopen(read_fd, "rb") as pipe:
        while True:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([pipe], [], [], max(left, 0))
            if not ready:
                break
            chunk = os.read(pipe.fileno(), 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    timed_out = time.monotonic() >= deadline
    if timed_out:
        kill_descendants(pid, timeout=5)
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    os.waitpid(pid, 0)
    if server is not None:  # a rank that outlived its task: not in the next task's way
        kill_descendants(server, timeout=5)
    if timed_out:
        return CheckResult(False, f"the check ran over {timeout:g} s and was stopped")
    if not chunks:
        return CheckResult(False, "the check's process ended without a verdict")
    try:
        return CheckResult(**json.loads(b"".join(chunks)))
    except (ValueError, TypeError):  # something else wrote to the verdict's pipe too
        return CheckResult(False, "the check's process sent no readable verdict")


def _child(job: CheckJob, write_fd: int) -> None:
    import multiprocessing.forkserver

    from course_lib.grading.isolate import run_job

    os.setsid()
    for fd in _ZYGOTE_FDS:
        os.close(fd)
    if getattr(multiprocessing.forkserver._forkserver, "_forkserver_pid", None) is not None:
        # the zygote warmed a server (its unit's checks launch ranks): hand ranks out from it.
        # Imported only then: the module imports torch, which a torch-free check never needs.
        from course_lib.runtime.processes import adopt_inherited_forkserver

        adopt_inherited_forkserver()
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    try:
        with no_process_left():  # what the learner started, in its own session too
            result = run_job(job)
    except BaseException as exc:  # noqa: BLE001 - whatever happens, a verdict goes back
        result = CheckResult(False, f"the check could not run: {type(exc).__name__}: {exc}")
    try:
        with os.fdopen(write_fd, "w") as out:
            out.write(json.dumps(asdict(result)))
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(0)
