"""The process every clean check is forked from: ``course_lib`` imported once, no learner code.

    with Zygote("course_lib.units.u05_cpu_offload", cwd=folder, seed=7) as zygote:
        ...                                   # meanwhile the learner's kernel runs
        results = zygote.run(jobs, timeout=240)

The zygote starts while the learner's notebook runs in its kernel and forks a *unit process*,
which imports the unit and its checks and traps the course's answers the checks name
(:func:`course_lib.grading.isolate.prepare`), and waits for the jobs. For each task the unit
process forks a child in its own session, which runs the task
(:func:`course_lib.grading.isolate.run_job`), writes its result on a pipe, kills whatever it
started (processes in their own session too) and exits; a child that runs over its timeout is
killed with everything it started. Forking gives each check the same clean state a fresh
interpreter would, without its seconds of imports.

The zygote runs on the learner's side of the wall (:mod:`course_lib.grading.sandbox_main`, in
the notebook's sandbox): one per notebook, gone with it. What its checks hand back is data for
the judge (:mod:`course_lib.grading.judge`), never a verdict.

For a unit whose checks launch ranks, the unit process also starts the launcher's forkserver
while it waits, as a fork of itself (:func:`course_lib.runtime.processes.start_forkserver_by_fork`:
torch is not imported a second time, ~4 s of CPU less per notebook), and every child hands out its
ranks from that one server (:func:`course_lib.runtime.processes.adopt_inherited_forkserver`): a
cold server costs ~4 s per task otherwise. The server holds no learner state (ranks are forks of
it, never the reverse), and any rank still alive when a task ends is killed before the next task
starts.

What runs inside the zygote is :mod:`course_lib.grading.zygote_main`.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from types import TracebackType

from course_lib.grading.isolate import CheckJob, CheckResult
from course_lib.runtime.reap import collect, in_session, kill_descendants

__all__ = ["Zygote"]


class Zygote:
    """A clean process for ``unit``'s checks (see the module doc); use it as a context manager."""

    def __init__(self, unit: str, *, cwd: Path, seed: int, env: dict[str, str] | None = None):
        from course_lib.grading.kernels import kernel_env

        env = dict(env if env is not None else kernel_env())
        env["COURSE_GRADE_SEED"] = str(seed)
        env["MPLBACKEND"] = "Agg"
        self.unit, self.cwd, self.seed = unit, Path(cwd), seed
        self._log = tempfile.TemporaryFile()  # its output: the last line names a lost verdict
        read_fd, write_fd = os.pipe()
        code = "from course_lib.grading.zygote_main import main; main()"
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", code, str(write_fd), unit],
                stdin=subprocess.PIPE,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                pass_fds=(write_fd,),
                cwd=cwd,
                env=env,
                start_new_session=True,
            )
        finally:
            os.close(write_fd)
        self._results = os.fdopen(read_fd, "rb", buffering=0)
        self._pending = b""

    def run(self, jobs: list[CheckJob], *, timeout: float) -> list[CheckResult]:
        """Each job's result, in the order of ``jobs``; ``timeout``: seconds per job. The zygote
        is closed afterwards."""
        results = self.ask(jobs, timeout=timeout)
        self.close()
        if results is not None:
            return results
        self._log.seek(0)
        tail = self._log.read().decode(errors="replace").strip().splitlines()[-1:] or [""]
        lost = (
            f"the grading process ended without a verdict (exit {self.proc.returncode}) {tail[0]}"
        )
        return [CheckResult(False, lost.strip())] * len(jobs)

    def ask(
        self,
        jobs: list[CheckJob],
        *,
        timeout: float,
        seed: int | None = None,
        cwd: Path | None = None,
    ) -> list[CheckResult] | None:
        """Each job's result, the zygote kept warm for the next request; None (and the zygote
        closed) when it died or ran over ``timeout`` per job. ``seed`` and ``cwd``: those of this
        request's notebook (default: the zygote's)."""
        request = {
            "jobs": [asdict(j) for j in jobs],
            "timeout": timeout,
            "seed": str(self.seed if seed is None else seed),
            "cwd": str(self.cwd if cwd is None else cwd),
        }
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(json.dumps(request).encode() + b"\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            self.close()
            return None
        line = self._line(time.monotonic() + timeout * len(jobs) + 120)
        if line is None:
            self.close()
            return None
        return [CheckResult(**r) for r in json.loads(line)]

    def alive(self) -> bool:
        return self.proc.poll() is None

    def _line(self, deadline: float) -> bytes | None:
        """The zygote's next line of results, or None at its end or past ``deadline``."""
        while b"\n" not in self._pending:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self._results], [], [], max(left, 0))
            if not ready:
                return None
            chunk = os.read(self._results.fileno(), 1 << 16)
            if not chunk:
                return None
            self._pending += chunk
        line, _, self._pending = self._pending.partition(b"\n")
        return line

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
        self._log.close()
