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

A batch (:mod:`course_lib.grading.batch`) keeps one zygote per worker warm across the notebooks
of a unit (:class:`WarmZygote`, :meth:`Zygote.ask`): each request carries its notebook's seed and
folder, and its tasks are still forks of the same clean state. A zygote that dies (an answer that
kills its parent) costs only that request: the notebook is graded again in a fresh one.

For a unit whose checks launch ranks, the zygote also starts the launcher's forkserver while it
waits, as a fork of itself (:func:`course_lib.runtime.processes.start_forkserver_by_fork`: torch
is not imported a second time, ~4 s of CPU less per notebook), and every child hands out its
ranks from that one server (:func:`course_lib.runtime.processes.adopt_inherited_forkserver`): a
cold server costs ~4 s per task otherwise. The server holds no learner state (ranks are forks of
it, never the reverse), and any rank still alive when a task ends is killed before the next task
starts.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from types import TracebackType

from course_lib.grading.isolate import CheckJob, CheckResult
from course_lib.runtime.reap import collect, in_session, kill_descendants, no_process_left

__all__ = ["WarmZygote", "Zygote", "zygote_for"]


class Zygote:
    """A clean process for ``unit``'s checks (see the module doc); use it as a context manager."""

    def __init__(self, unit: str, *, cwd: Path, seed: int, env: dict[str, str] | None = None):
        from course_lib.grading.execute import kernel_env

        env = dict(env if env is not None else kernel_env())
        env["COURSE_GRADE_SEED"] = str(seed)
        env["MPLBACKEND"] = "Agg"
        self.unit, self.cwd, self.seed = unit, Path(cwd), seed
        self._log = tempfile.TemporaryFile()  # its output: the last line names a lost verdict
        read_fd, write_fd = os.pipe()
        code = "from course_lib.grading.zygote import main; main()"
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


# --------------------------------------------------------------------------- inside the zygote
def main() -> None:
    """The zygote: import, trap, wait for the jobs, fork one child per task."""
    result_fd, unit = int(sys.argv[1]), sys.argv[2]
    _ZYGOTE_FDS.append(result_fd)  # closed in every child, before any learner code
    from course_lib.grading.isolate import _python_source, prepare

    prepare(unit)
    _python_source("")  # IPython's transformer imported before the fork, not in every child
    if "torch" in sys.modules:
        # The first optimizer a process builds imports torch._dynamo (torch.optim.Optimizer's
        # __init__ is wrapped by torch._disable_dynamo): ~2-3 s of CPU in every child that
        # builds one. Imported once here, each child finds it (units 03, 05, 06: 4-6 s less).
        import torch._dynamo  # noqa: F401
    with no_process_left():  # orphans of the checks come back here and are killed
        server = _warm_forkserver(unit)
        out = os.fdopen(result_fd, "w")
        for line in sys.stdin.buffer:  # one request per line, until the grader closes stdin
            request = json.loads(line)
            timeout = float(request["timeout"])
            where = (request["seed"], request["cwd"])
            results = [
                asdict(_fork(CheckJob(**spec), timeout, server, where)) for spec in request["jobs"]
            ]
            out.write(json.dumps(results) + "\n")
            out.flush()
    sys.stdout.flush()
    os._exit(0)


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


class WarmZygote:
    """One zygote kept warm across a batch worker's notebooks: reused while they are of the same
    unit, replaced when the unit changes or it died. ``close()`` at the end."""

    def __init__(self) -> None:
        self._zygote: Zygote | None = None

    def get(self, unit: str, *, cwd: Path, seed: int) -> Zygote:
        if self._zygote is None or self._zygote.unit != unit or not self._zygote.alive():
            self.close()
            self._zygote = Zygote(unit, cwd=cwd, seed=seed)
        return self._zygote

    def run(
        self, zygote: Zygote, jobs: list[CheckJob], *, timeout: float, seed: int, cwd: Path
    ) -> list[CheckResult]:
        """``jobs`` of one notebook in ``zygote`` (this worker's, from :meth:`get`). If it died
        meanwhile (an earlier notebook's answer may have killed it) or ran over: this notebook
        again, in a fresh zygote of its own; the next :meth:`get` starts a new warm one."""
        results = zygote.ask(jobs, timeout=timeout, seed=seed, cwd=cwd)
        if results is not None:
            return results
        self.close()
        with Zygote(zygote.unit, cwd=cwd, seed=seed) as fresh:
            return fresh.run(jobs, timeout=timeout)

    def close(self) -> None:
        if self._zygote is not None:
            self._zygote.__exit__(None, None, None)
            self._zygote = None


@contextlib.contextmanager
def zygote_for(
    unit: str, *, cwd: Path, seed: int, warm: WarmZygote | None = None
) -> Iterator[Zygote]:
    """A zygote for one notebook: ``warm``'s (kept afterwards), else a new one, started now so it
    warms up while the notebook runs, and closed at the end of the block."""
    if warm is not None:
        yield warm.get(unit, cwd=cwd, seed=seed)
        return
    with Zygote(unit, cwd=cwd, seed=seed) as zygote:
        yield zygote
