"""The process every clean check is forked from: ``course_lib`` imported once, no learner code.

    with Zygote("course_lib.units.u05_cpu_offload", cwd=folder, seed=7) as zygote:
        ...                                   # meanwhile the learner's kernel runs
        results = zygote.run(jobs, timeout=240)

The zygote starts while the learner's notebook runs in its kernel, imports ``torch``,
``course_lib``, the unit and its checks, and traps the course's answers the checks name
(:func:`course_lib.grading.isolate.prepare`). It then waits for the jobs. For each task it forks
a child in its own session, which runs the task (:func:`course_lib.grading.isolate.run_job`),
writes its result on a pipe, kills whatever it started (processes in their own session too) and
exits; a child that runs over its timeout is killed with everything it started. Forking gives
each check the same clean state a fresh interpreter would, without its seconds of imports.

For a unit whose checks launch ranks, the zygote also starts the launcher's forkserver (torch
preloaded) while it waits, and every child hands out its ranks from that one server
(:func:`course_lib.runtime.processes.adopt_inherited_forkserver`): a cold server costs ~4 s per
task otherwise. The server holds no learner state (ranks are forks of it, never the reverse), and
any rank still alive when a task ends is killed before the next task starts.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from types import TracebackType

from course_lib.grading.isolate import CheckJob, CheckResult
from course_lib.runtime.reap import collect, in_session, kill_descendants, no_process_left

__all__ = ["Zygote"]


class Zygote:
    """A clean process for ``unit``'s checks (see the module doc); use it as a context manager."""

    def __init__(self, unit: str, *, cwd: Path, seed: int, env: dict[str, str] | None = None):
        from course_lib.grading.execute import kernel_env

        env = dict(env if env is not None else kernel_env())
        env["COURSE_GRADE_SEED"] = str(seed)
        env["MPLBACKEND"] = "Agg"
        read_fd, write_fd = os.pipe()
        code = "from course_lib.grading.zygote import main; main()"
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", code, str(write_fd), unit],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                pass_fds=(write_fd,),
                cwd=cwd,
                env=env,
                start_new_session=True,
            )
        finally:
            os.close(write_fd)
        self._results = os.fdopen(read_fd, "rb")

    def run(self, jobs: list[CheckJob], *, timeout: float) -> list[CheckResult]:
        """Each job's result, in the order of ``jobs``; ``timeout``: seconds per job."""
        payload = json.dumps({"jobs": [asdict(j) for j in jobs], "timeout": timeout}).encode()
        try:
            output, _ = self.proc.communicate(payload, timeout=timeout * len(jobs) + 120)
        except subprocess.TimeoutExpired:
            output = b""
        finally:
            self.close()
        data = self._results.read()
        results = [CheckResult(**r) for r in json.loads(data or b"[]")]
        tail = output.decode(errors="replace").strip().splitlines()[-1:] or [""]
        lost = (
            f"the grading process ended without a verdict (exit {self.proc.returncode}) {tail[0]}"
        )
        return results + [CheckResult(False, lost.strip())] * (len(jobs) - len(results))

    def close(self) -> None:
        """Kill the zygote and everything it started (idempotent). What it started (its warm
        forkserver) dies unreaped while the zygote is killed, and is re-parented here when this
        process is a subreaper: those are collected, not left as zombies."""
        killed = kill_descendants(self.proc.pid, timeout=5)
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        # the killpg may have killed one the listing missed (started after it): its session says
        # it was the zygote's, so it is collected too, never a child someone else will wait for
        collect(killed + [p for p in in_session(self.proc.pid) if p not in killed], timeout=5)

    def __enter__(self) -> Zygote:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
        self._results.close()


# --------------------------------------------------------------------------- inside the zygote
def main() -> None:
    """The zygote: import, trap, wait for the jobs, fork one child per task."""
    result_fd, unit = int(sys.argv[1]), sys.argv[2]
    from course_lib.grading.isolate import _python_source, prepare

    prepare(unit)
    _python_source("")  # IPython's transformer imported before the fork, not in every child
    with no_process_left():  # orphans of the checks come back here and are killed
        server = _warm_forkserver(unit)
        request = json.loads(sys.stdin.buffer.read() or b'{"jobs": []}')
        results = [
            asdict(_fork(CheckJob(**spec), float(request["timeout"]), server))
            for spec in request["jobs"]
        ]
    with os.fdopen(result_fd, "w") as out:
        out.write(json.dumps(results))
    sys.stdout.flush()
    os._exit(0)


_LAUNCHES = re.compile(r"\b(launch|launch_learner|RankSet)\(")


def _warm_forkserver(unit: str) -> int | None:
    """Start the launcher's forkserver now if ``unit``'s checks launch ranks; its pid, else None."""
    import importlib.util
    import multiprocessing.forkserver

    from course_lib.runtime import processes

    try:
        spec = importlib.util.find_spec(unit)
    except ImportError:  # a unit the course does not have (a test's fixture): no checks to read
        return None
    if spec is None or not spec.origin:
        return None
    folder = Path(spec.origin).parent
    if not any(_LAUNCHES.search(p.read_text()) for p in folder.glob("checks*.py")):
        return None
    if processes.start_method() != "forkserver":
        return None
    return getattr(multiprocessing.forkserver._forkserver, "_forkserver_pid", None)


def _fork(job: CheckJob, timeout: float, server: int | None = None) -> CheckResult:
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the task's clean process
        os.close(read_fd)
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
    return CheckResult(**json.loads(b"".join(chunks)))


def _child(job: CheckJob, write_fd: int) -> None:
    from course_lib.grading.isolate import run_job
    from course_lib.runtime.processes import adopt_inherited_forkserver

    os.setsid()
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
