"""N persistent ranks that run code on request, with :func:`course_lib.launch`'s guarantees.

Introduced in notebooks/08_collectives.ipynb ("step through a ring all-reduce"); the notebook
front end is the ``%%ranks`` magic of :mod:`course_lib.ranks`. ``launch`` runs one function and
the ranks exit; a :class:`RankSet` keeps its ranks (and their process group, tensors, models)
alive between requests, so a notebook can advance a distributed algorithm one cell at a time.

It reuses launch's machinery: ranks are forks of the warm forkserver (torch preloaded), get the
caller's environment and import path, meet through a FileStore in a private temporary
directory, use gloo on CPU or NCCL with one GPU per rank (``device.resolve_backend``), and
write stdout/stderr (fds 1 and 2) to per-rank files that are read back in rank order.

Guarantees, per request (a cell):

* it has a deadline (``timeout`` s): ranks still running then are asked for their Python stack
  (SIGUSR1, faulthandler), interrupted (SIGINT), and killed if they do not stop within
  ``_GRACE_S``;
* a rank that raises fails the request naming it, with its traceback; ranks still running
  ``_GRACE_S`` later (usually waiting in a collective for the failed rank) are interrupted; a
  rank that stops is still usable, with its state;
* Ctrl-C / "interrupt kernel" interrupts every running rank (SIGINT; within ``_GRACE_S``);
  a rank that does not stop (stuck in C++, e.g. a gloo wait) is killed;
* a rank that dies (a signal, an ``os._exit``) is reported with its signal; the set is then
  stopped, since a process group cannot go on without one of its ranks: ``start`` a new one;
* nothing outlives the kernel: every rank watches a lifeline pipe whose only write end the
  kernel holds (parent-death watch), and ranks stay in the kernel's process group, which
  Jupyter signals on interrupt and kills on restart. ``stop`` (also run at exit) ends them.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import shutil
import signal
import time

import cloudpickle

from course_lib import validate
from course_lib.runtime import _rank_server, _worker
from course_lib.runtime._outcomes import _read_text
from course_lib.runtime._workdir import _new_workdir, _reclaim_stale_workdirs
from course_lib.runtime.device import check_backend_name, resolve_backend
from course_lib.runtime.launch import (
    _START_ALLOWANCE_S,
    _caller_sys_path,
    _child_start_method,
    _forkserver_running,
    _InterruptGuard,
    _loopback_interface,
    _start_method,
    _stop,
)

_GRACE_S = 1.0  # after an interrupt, a failure or the deadline: time a rank gets to stop


def _signal_name(exitcode: int) -> str:
    try:
        return signal.Signals(-exitcode).name
    except ValueError:
        return f"signal {-exitcode}"


def describe_exit(exitcode: int) -> str:
    """How a rank process ended, in words (a signal by name)."""
    if exitcode < 0:
        return f"was killed by signal {_signal_name(exitcode)} (exit code {exitcode})"
    return f"exited with code {exitcode}"


class RankReply(dict):
    """What one rank did with one request: ``status`` ("ok", "error", "interrupted", "timeout",
    "died", "killed"), ``value`` (repr of the last expression, or the gathered value),
    ``stdout``, ``stderr``, ``error`` (text, with the traceback), ``notes``, ``seconds``."""


class RankSet:
    """``world_size`` persistent ranks; see the module docstring. Use :meth:`start` first."""

    def __init__(
        self,
        world_size: int,
        *,
        backend: str = "auto",
        timeout: float = 60.0,
        threads_per_rank: int = 1,
    ):
        self.world_size = validate.count("world_size", world_size, minimum=1)
        self.timeout = validate.number("timeout", timeout, positive=True, maximum=86400.0)
        self.threads_per_rank = validate.count("threads_per_rank", threads_per_rank, minimum=1)
        check_backend_name(backend)
        self.backend = resolve_backend(backend, self.world_size)
        self.procs: list = []
        self._conns: list = []
        self._lifelines: list = []
        self._offsets: dict[tuple[int, str], int] = {}
        self._seq = 0  # number of the request in flight (the start counts as 0)
        self.workdir: str | None = None
        self.start_seconds: float | None = None
        self.ended: str | None = None  # why the set is no longer usable (None: never started)

    # ------------------------------------------------------------------ lifecycle
    @property
    def alive(self) -> bool:
        return bool(self.procs) and self.ended is None

    def start(self) -> RankSet:
        """Start the ranks and wait until each has joined the process group."""
        from course_lib.runtime.errors import LaunchError

        t0 = time.perf_counter()
        _reclaim_stale_workdirs()
        warm = _forkserver_running()
        method = _start_method()
        context = multiprocessing.get_context(method)
        self.workdir = _new_workdir()
        spec = {
            "world_size": self.world_size,
            "backend": self.backend,
            "pg_timeout": self.timeout,
            "threads": self.threads_per_rank,
            "workdir": self.workdir,
            "env": dict(os.environ),
            "sys_path": _caller_sys_path(),
            "child_start_method": _child_start_method(),
            "loopback_interface": _loopback_interface(),
        }
        with _InterruptGuard() as guard:
            guard.hold()  # an interrupt while starting is acted on once every rank is accounted for
            try:
                for rank in range(self.world_size):
                    ours, theirs = context.Pipe()
                    life_r, life_w = context.Pipe(duplex=False)
                    proc = context.Process(
                        target=_rank_server.serve,
                        daemon=False,
                        args=(rank, spec, theirs, life_r),
                        name=f"course_lib-rank{rank}",
                    )
                    proc.start()
                    theirs.close()
                    life_r.close()
                    self.procs.append(proc)
                    self._conns.append(ours)
                    self._lifelines.append(life_w)
                allowance = _START_ALLOWANCE_S[0 if warm and method == "forkserver" else 1]
                replies = self._collect(
                    set(range(self.world_size)), allowance + self.timeout, guard
                )
            except BaseException:
                self.stop()
                raise
            if guard.held:
                guard.held = False
                self.stop()
                raise KeyboardInterrupt
        failed = {
            r: self._failure_text(r, rep) for r, rep in replies.items() if rep["status"] != "ok"
        }
        if failed:
            self.stop()
            raise LaunchError(
                f"{len(failed)} of {self.world_size} ranks failed to start (first: "
                f"rank {min(failed)}).\n"
                + "\n".join(f"--- rank {r} {t}" for r, t in sorted(failed.items())),
                failed,
            )
        self.ended = None
        self.start_seconds = time.perf_counter() - t0
        return self

    def stop(self, reason: str = "stopped") -> None:
        """End every rank (politely, then SIGTERM/SIGKILL) and remove the set's directory."""
        for conn in self._conns:
            try:
                conn.send_bytes(bytes(8) + cloudpickle.dumps(("stop",)))
            except (OSError, ValueError):
                pass
        deadline = time.monotonic() + _GRACE_S
        for proc in self.procs:
            proc.join(timeout=max(0.0, deadline - time.monotonic()))
        _stop(self.procs)
        for handle in self._conns + self._lifelines:
            handle.close()
        for proc in self.procs:
            try:
                proc.close()
            except ValueError:
                pass
        self._conns, self._lifelines = [], []
        self.procs = []
        if self.workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
        self.ended = reason

    def check_ranks(self, ranks) -> list[int]:
        """The requested ranks as a sorted list (None: all); ValueError naming any that do not exist."""
        if ranks is None:
            return list(range(self.world_size))
        ranks = sorted(set(validate.counts("ranks", ranks, minimum=0)))
        missing = [r for r in ranks if r >= self.world_size]
        if missing or not ranks:
            raise ValueError(
                f"ranks = {missing or ranks}: expected ranks of this set, 0 to "
                f"{self.world_size - 1} (it has {self.world_size}); start a larger "
                f"set with %ranks start N for more"
            )
        return ranks

    # ------------------------------------------------------------------ requests
    def run(
        self,
        source: str,
        ranks=None,
        *,
        definitions=(),
        timeout: float | None = None,
        filename: str = "<ranks cell>",
    ) -> dict[int, RankReply]:
        """Execute ``source`` on ``ranks`` (default: all); rank -> :class:`RankReply`.

        ``definitions``: (label, source, filename) triples run first (a failure becomes a note,
        not an error), the same for every rank or a dict rank -> triples.
        Never raises for what a rank did: read each reply's ``status``."""
        ranks = self.check_ranks(ranks)
        per_rank = definitions if isinstance(definitions, dict) else {r: definitions for r in ranks}
        requests = {
            r: cloudpickle.dumps(("exec", list(per_rank.get(r, ())), source, filename))
            for r in ranks
        }
        return self._request(requests, timeout)

    def gather(
        self, expression: str, ranks=None, *, definitions=(), timeout: float | None = None
    ) -> list:
        """Evaluate ``expression`` on each rank and return the values, in rank order
        (``definitions`` as for :meth:`run`, executed first)."""
        from course_lib.runtime.errors import LaunchError

        ranks = self.check_ranks(ranks)
        per_rank = definitions if isinstance(definitions, dict) else {r: definitions for r in ranks}
        replies = self._request(
            {r: cloudpickle.dumps(("eval", list(per_rank.get(r, ())), expression)) for r in ranks},
            timeout,
        )
        failed = {
            r: self._failure_text(r, rep) for r, rep in replies.items() if rep["status"] != "ok"
        }
        if failed:
            raise LaunchError(
                f"gather({expression!r}) failed on ranks {sorted(failed)}.\n"
                + "\n".join(f"--- rank {r} {t}" for r, t in sorted(failed.items())),
                failed,
            )
        return [cloudpickle.loads(replies[r]["value"]) for r in sorted(replies)]

    def push(self, values: dict, ranks=None, *, timeout: float | None = None) -> None:
        """Define ``name = value`` in each rank for every item of ``values`` (sent by cloudpickle)."""
        from course_lib.runtime.errors import LaunchError

        request = cloudpickle.dumps(("push", cloudpickle.dumps(values)))
        replies = self._request({r: request for r in self.check_ranks(ranks)}, timeout)
        failed = {
            r: self._failure_text(r, rep) for r, rep in replies.items() if rep["status"] != "ok"
        }
        if failed:
            raise LaunchError(f"push failed on ranks {sorted(failed)}", failed)

    def _request(self, requests: dict[int, bytes], timeout: float | None) -> dict[int, RankReply]:
        if not self.alive:
            raise RuntimeError(
                f"the ranks are {self.ended or 'not started'}: start them first "
                "(%ranks start N, or RankSet(N).start())"
            )
        timeout = (
            self.timeout
            if timeout is None
            else validate.number("timeout", timeout, positive=True, maximum=86400.0)
        )
        for rank, proc in enumerate(self.procs):  # a rank that died since the last request
            if proc.exitcode is not None:
                reason = f"rank {rank} {describe_exit(proc.exitcode)} since the last cell"
                self.stop(reason)
                raise RuntimeError(
                    f"{reason}; the set was stopped (a process group cannot go on "
                    "without one of its ranks): %ranks restart starts a new one"
                )
        ranks = sorted(requests)
        self._seq += 1  # replies carry it: one left over from an abandoned request is ignored
        with _InterruptGuard() as guard:
            guard.hold()  # an interrupt is acted on only inside the wait (never half-way through
            for rank in ranks:  # sending, which would leave ranks out of step with the kernel)
                for kind in ("out", "err"):
                    path = _worker.rank_file(self.workdir, rank, kind)
                    self._offsets[rank, kind] = os.path.getsize(path) if os.path.exists(path) else 0
                self._conns[rank].send_bytes(self._seq.to_bytes(8, "little") + requests[rank])
            replies = self._collect(set(ranks), timeout, guard)
            guard.held = False  # the caller re-raises the interrupt after showing the output
        for rank in ranks:
            replies[rank]["stdout"] = self._new_output(rank, "out")
            replies[rank]["stderr"] = self._new_output(rank, "err")
        return replies

    def _collect(self, pending: set[int], timeout: float, guard) -> dict[int, RankReply]:
        """Wait for the replies of ``pending`` ranks under the deadline / failure / interrupt rules."""
        replies: dict[int, RankReply] = {r: RankReply(status="running") for r in pending}
        deadline = time.monotonic() + timeout
        stopping_since = None  # when the remaining ranks were interrupted
        first_failure = None
        dead: set[int] = set()
        while pending:
            now = time.monotonic()
            if stopping_since is None:
                reason = (
                    "interrupted"
                    if guard.held
                    else "timeout"
                    if now >= deadline
                    else "interrupted"
                    if first_failure and now >= first_failure + _GRACE_S
                    else None
                )
                if reason:
                    self._interrupt(pending, replies, reason, timeout)
                    stopping_since = now
            elif now >= stopping_since + _GRACE_S:
                break
            limit = (
                stopping_since + _GRACE_S
                if stopping_since
                else min(deadline, first_failure + _GRACE_S)
                if first_failure
                else deadline
            )
            waitables = {self._conns[r]: r for r in pending}
            waitables.update(
                {p.sentinel: -1 - r for r, p in enumerate(self.procs) if r not in dead}
            )
            try:
                guard.holding = guard.held  # the first interrupt raises here; later ones are held
                ready = multiprocessing.connection.wait(
                    list(waitables), max(0.0, min(limit - now, 0.2))
                )
            except KeyboardInterrupt:
                guard.held = guard.holding = True
                continue
            finally:
                guard.holding = True
            for handle in ready:
                rank = waitables[handle]
                if rank < 0:  # a process ended: the others get the grace period to report, no more
                    if self._rank_died(-1 - rank, pending, replies):
                        dead.add(-1 - rank)
                        stopping_since = stopping_since or time.monotonic()
                    continue
                try:
                    data = self._conns[rank].recv_bytes()
                except (EOFError, OSError):
                    continue  # its sentinel reports the death
                if int.from_bytes(data[:8], "little") != self._seq:
                    continue  # the late reply of an earlier request
                reply = cloudpickle.loads(data[8:])
                pending.discard(rank)
                replies[rank].update(self._reply_fields(reply, replies[rank]))
                if replies[rank]["status"] not in ("ok", "interrupted") and first_failure is None:
                    first_failure = time.monotonic()
        if pending or dead:
            for rank in sorted(pending):
                why = replies[rank].get("stop_reason", "interrupted")
                why = (
                    f"still running at the deadline (timeout={timeout:g} s), then "
                    if why == "timeout"
                    else ""
                )
                replies[rank].update(
                    status="killed",
                    error=(
                        f"{why}did not stop within {_GRACE_S:g} s of being interrupted (stuck in C++, "
                        "e.g. waiting in a collective for a rank that is not in it): killed"
                    ),
                )
            self.stop("a rank died or did not stop")
        return replies

    def _interrupt(self, pending: set[int], replies: dict, reason: str, timeout: float) -> None:
        if reason == "timeout" and hasattr(signal, "SIGUSR1"):
            files = {r: _worker.rank_file(self.workdir, r, "stack") for r in pending}
            before = {r: os.path.getsize(f) if os.path.exists(f) else 0 for r, f in files.items()}
            self._signal(pending, signal.SIGUSR1)  # each rank's Python stack, into its stack file
            # a signal that arrives while another is pending may go to a thread that is not the
            # main one (a sleeping main thread would then never see it): one at a time
            time.sleep(0.1)
            for rank in pending:  # only what this dump added (earlier deadlines wrote there too)
                stack = _read_text(files[rank])[before[rank] :].strip().splitlines()
                cut = next(
                    (i for i, line in enumerate(stack) if _rank_server.__file__ in line), len(stack)
                )  # the cell's frames come first; the server's are noise
                replies[rank]["stack"] = "\n".join(stack[:cut])
                replies[rank]["deadline"] = timeout
        for rank in pending:
            replies[rank]["stop_reason"] = reason
        self._signal(pending, signal.SIGINT)

    def _signal(self, ranks, signum: int) -> None:
        for rank in sorted(ranks):
            try:
                os.kill(self.procs[rank].pid, signum)
            except ProcessLookupError:
                pass

    @staticmethod
    def _reply_fields(reply: tuple, current: RankReply) -> dict:
        if reply[0] == "ok":
            return {"status": "ok", "value": reply[1], "notes": reply[2], "seconds": reply[-1]}
        _, exc_type, message, tb, notes = reply[:5]
        status = "error"
        if exc_type == "KeyboardInterrupt" and current.get("stop_reason") == "timeout":
            status = "timeout"
        elif exc_type == "KeyboardInterrupt":
            status = "interrupted"
        return {
            "status": status,
            "error": f"raised {exc_type}: {message}\n{tb.rstrip()}",
            "exc_type": exc_type,
            "notes": notes,
        }

    def _rank_died(self, rank: int, pending: set[int], replies: dict) -> bool:
        proc = self.procs[rank]
        proc.join(timeout=1.0)
        if proc.exitcode is None:
            return False
        pending.discard(rank)
        tail = _read_text(_worker.rank_file(self.workdir, rank, "err")).rstrip().splitlines()[-10:]
        text = describe_exit(proc.exitcode)
        if tail:
            text += "\nlast lines of its stderr:\n" + "\n".join(tail)
        replies.setdefault(rank, RankReply())
        replies[rank].update(status="died", error=text)
        return True

    def _new_output(self, rank: int, kind: str) -> str:
        path = _worker.rank_file(self.workdir, rank, kind) if self.workdir else ""
        try:
            with open(path, "rb") as f:
                f.seek(self._offsets.get((rank, kind), 0))
                data = f.read()
        except OSError:
            return ""
        self._offsets[rank, kind] = self._offsets.get((rank, kind), 0) + len(data)
        return data.decode("utf-8", errors="replace")

    @staticmethod
    def _failure_text(rank: int, reply: RankReply) -> str:
        text = reply.get("error") or f"ended with status {reply['status']}"
        if reply["status"] == "timeout":
            text = (
                f"still running at the deadline (timeout={reply.get('deadline', 0):g} s): "
                f"interrupted\n{text}"
            )
        if reply.get("stack"):
            text += f"\nits Python stack at the deadline:\n{reply['stack']}"
        return text
