"""N persistent ranks that run code on request, with :func:`course_lib.launch`'s guarantees.

Introduced in notebooks/08_collectives.ipynb ("step through a ring all-reduce"); the notebook
front end is the ``%%ranks`` magic of :mod:`course_lib.ranks`. ``launch`` runs one function and
the ranks exit; a :class:`RankSet` keeps its ranks (and their process group, tensors, models)
alive between requests, so a notebook can advance a distributed algorithm one cell at a time.
Ranks start as launch's do (``processes.py``: forks of the warm forkserver, the caller's
environment and import path, a FileStore rendezvous, output captured per rank).

Guarantees, per request (a cell):

* a deadline (``timeout`` s): ranks still running then are asked for their Python stack
  (SIGUSR1, faulthandler), interrupted (SIGINT), and killed if they do not stop within ``GRACE_S``;
* a rank that raises fails the request naming it, with its traceback; ranks still running
  ``GRACE_S`` later (usually waiting in a collective for it) are interrupted and keep their state;
* Ctrl-C / "interrupt kernel" interrupts every running rank (SIGINT; within ``GRACE_S``);
  a rank that does not stop (stuck in C++, e.g. a gloo wait) is killed;
* a rank that dies (a signal, an ``os._exit``) is reported with its signal; the set is then
  stopped, since a process group cannot go on without one of its ranks: ``start`` a new one;
* nothing outlives the kernel: every rank watches a lifeline pipe whose only write end the
  kernel holds, and ranks stay in the kernel's process group, which Jupyter signals on
  interrupt and kills on restart. ``stop`` (also run at exit) ends them.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import signal
import time
from collections.abc import Iterable
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

import cloudpickle

from course_lib import validate
from course_lib.runtime import _rank_server, _worker, processes
from course_lib.runtime._outcomes import read_text
from course_lib.runtime._payload import pickle_values
from course_lib.runtime._workdir import _new_workdir, _reclaim_stale_workdirs, _remove_workdir
from course_lib.runtime.device import check_backend_name, resolve_backend
from course_lib.runtime.errors import LaunchError
from course_lib.runtime.protocol import BackendChoice, CellReply, RankSpec, Request
from course_lib.runtime.replies import (
    Definitions,
    OutputTail,
    RankReply,
    ReplyWait,
    StopReason,
    definitions_for,
    describe_exit,
    failure_error,
    failures,
)

__all__ = ["RankSet", "RankReply", "describe_exit", "GRACE_S"]

GRACE_S = 1.0  # after an interrupt, a failure or the deadline: time a rank gets to stop


class RankSet:
    """``world_size`` persistent ranks; see the module docstring. Use :meth:`start` first."""

    def __init__(
        self,
        world_size: int,
        *,
        backend: BackendChoice = "auto",
        timeout: float = 60.0,
        threads_per_rank: int = 1,
    ) -> None:
        self.world_size = validate.count("world_size", world_size, minimum=1)
        self.timeout = validate.number("timeout", timeout, positive=True, maximum=86400.0)
        self.threads_per_rank = validate.count("threads_per_rank", threads_per_rank, minimum=1)
        check_backend_name(backend)
        self.backend = resolve_backend(backend, self.world_size)
        self.procs: list[BaseProcess] = []
        self._conns: list[Connection] = []
        self._lifelines: list[Connection] = []
        self._output = OutputTail()
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
        t0 = time.perf_counter()
        _reclaim_stale_workdirs()
        warm = processes.forkserver_running()
        method = processes.start_method()
        self.workdir = _new_workdir()
        spec = processes.rank_spec(
            self.world_size, self.backend, self.timeout, self.threads_per_rank, self.workdir
        )
        with processes.InterruptGuard() as guard:
            guard.hold()  # an interrupt while starting is acted on once every rank is accounted for
            try:
                self._spawn(multiprocessing.get_context(method), spec)
                allowance = processes.START_ALLOWANCE_S[0 if warm and method == "forkserver" else 1]
                replies = self._collect(
                    set(range(self.world_size)), allowance + self.timeout, guard
                )
            except BaseException as exc:
                self.stop()
                if guard.held and not isinstance(exc, KeyboardInterrupt):
                    # the interrupt reached the forkserver too, as it was starting: its pipe's
                    # EOFError is the interrupt's doing, not a fault of its own
                    raise KeyboardInterrupt from None
                raise
            if guard.held:
                guard.held = False
                self.stop()
                raise KeyboardInterrupt
        failed = failures(replies)
        if failed:
            self.stop()
            head = f"{len(failed)} of {self.world_size} ranks failed to start (first: rank {min(failed)})."
            raise failure_error(head, failed)
        self.ended = None
        self.start_seconds = time.perf_counter() - t0
        return self

    def _spawn(self, context: Any, spec: RankSpec) -> None:
        """Start one server process per rank, each with its request pipe and lifeline."""
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

    def stop(self, reason: str = "stopped") -> None:
        """End every rank (politely, then SIGTERM/SIGKILL) and remove the set's directory."""
        for conn in self._conns:
            try:
                conn.send_bytes(bytes(8) + cloudpickle.dumps(Request("stop")))
            except (OSError, ValueError):
                pass
        deadline = time.monotonic() + GRACE_S
        for proc in self.procs:
            proc.join(timeout=max(0.0, deadline - time.monotonic()))
        processes.stop_processes(self.procs)
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
            _remove_workdir(self.workdir)
        self.ended = reason

    def check_ranks(self, ranks: Iterable[int] | None) -> list[int]:
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
        ranks: Iterable[int] | None = None,
        *,
        definitions: Definitions = (),
        timeout: float | None = None,
        filename: str = "<ranks cell>",
    ) -> dict[int, RankReply]:
        """Execute ``source`` on ``ranks`` (default: all); rank -> :class:`RankReply`.

        ``definitions``: (label, source, filename) triples run first (a failure becomes a note,
        not an error), the same for every rank or a dict rank -> triples.
        Never raises for what a rank did: read each reply's ``status``."""
        selected = self.check_ranks(ranks)
        requests = {
            r: Request("exec", source, filename, definitions_for(definitions, r)) for r in selected
        }
        return self._request(requests, timeout)

    def gather(
        self,
        expression: str,
        ranks: Iterable[int] | None = None,
        *,
        definitions: Definitions = (),
        timeout: float | None = None,
    ) -> list[Any]:
        """Evaluate ``expression`` on each rank and return the values, in rank order
        (``definitions`` as for :meth:`run`, executed first)."""
        selected = self.check_ranks(ranks)
        requests = {
            r: Request("eval", expression, definitions=definitions_for(definitions, r))
            for r in selected
        }
        replies = self._request(requests, timeout)
        failed = failures(replies)
        if failed:
            raise failure_error(f"gather({expression!r}) failed on ranks {sorted(failed)}.", failed)
        return [cloudpickle.loads(replies[r].value) for r in sorted(replies)]

    def push(
        self,
        values: dict[str, Any],
        ranks: Iterable[int] | None = None,
        *,
        timeout: float | None = None,
    ) -> None:
        """Define ``name = value`` in each rank for every item of ``values`` (sent by cloudpickle).
        ValueError for a name each rank defines itself (``rank``, ...), TypeError for a value
        that cannot be pickled, naming it; nothing is sent then."""
        request = Request("push", values=pickle_values(values))
        replies = self._request({r: request for r in self.check_ranks(ranks)}, timeout)
        failed = failures(replies)
        if failed:
            raise LaunchError(f"push failed on ranks {sorted(failed)}", failed)

    def _check_alive(self) -> None:
        if not self.alive:
            raise RuntimeError(
                f"the ranks are {self.ended or 'not started'}: start them first "
                "(%ranks start N, or RankSet(N).start())"
            )
        for rank, proc in enumerate(self.procs):  # a rank that died since the last request
            if proc.exitcode is not None:
                reason = f"rank {rank} {describe_exit(proc.exitcode)} since the last cell"
                self.stop(reason)
                raise RuntimeError(
                    f"{reason}; the set was stopped (a process group cannot go on "
                    "without one of its ranks): %ranks restart starts a new one"
                )

    def _request(self, requests: dict[int, Request], timeout: float | None) -> dict[int, RankReply]:
        self._check_alive()
        timeout = (
            self.timeout
            if timeout is None
            else validate.number("timeout", timeout, positive=True, maximum=86400.0)
        )
        ranks = sorted(requests)
        self._seq += 1  # replies carry it: one left over from an abandoned request is ignored
        with processes.InterruptGuard() as guard:
            guard.hold()  # an interrupt is acted on only inside the wait (never half-way through
            for rank in ranks:  # sending, which would leave ranks out of step with the kernel)
                for kind in ("out", "err"):
                    self._output.mark(rank, kind, self._rank_file(rank, kind))
                data = cloudpickle.dumps(requests[rank])
                self._conns[rank].send_bytes(self._seq.to_bytes(8, "little") + data)
            replies = self._collect(set(ranks), timeout, guard)
            guard.held = False  # the caller re-raises the interrupt after showing the output
        for rank in ranks:
            replies[rank].stdout = self._output.read(rank, "out", self._rank_file(rank, "out"))
            replies[rank].stderr = self._output.read(rank, "err", self._rank_file(rank, "err"))
        return replies

    def _rank_file(self, rank: int, kind: str) -> str:
        assert self.workdir is not None  # started
        return _worker.rank_file(self.workdir, rank, kind)

    def _collect(
        self, pending: set[int], timeout: float, guard: processes.InterruptGuard
    ) -> dict[int, RankReply]:
        """Wait for the replies of ``pending`` ranks under the deadline / failure / interrupt rules."""
        replies = {r: RankReply() for r in pending}
        wait = ReplyWait(pending, time.monotonic() + timeout, replies, GRACE_S)
        while wait.pending:
            now = time.monotonic()
            if wait.stopping_since is None:
                reason = wait.reason_to_stop(now, guard.held)
                if reason:
                    self._interrupt(wait.pending, wait.replies, reason, timeout)
                    wait.stopping_since = now
            elif now >= wait.stopping_since + GRACE_S:
                break
            waitables: dict[Any, int] = {self._conns[r]: r for r in wait.pending}
            waitables.update(
                {p.sentinel: -1 - r for r, p in enumerate(self.procs) if r not in wait.dead}
            )
            try:
                guard.holding = guard.held  # the first interrupt raises here; later ones are held
                ready = multiprocessing.connection.wait(
                    list(waitables), max(0.0, min(wait.limit() - now, 0.2))
                )
            except KeyboardInterrupt:
                guard.held = guard.holding = True
                continue
            finally:
                guard.holding = True
            for handle in ready:
                self._receive(waitables[handle], wait)
        if wait.pending or wait.dead:
            self._kill_stuck(wait, timeout)
        return wait.replies

    def _receive(self, rank: int, wait: ReplyWait) -> None:
        """A rank's pipe (rank >= 0) or its process sentinel (-1 - rank) is ready."""
        if rank < 0:  # a process ended: the others are interrupted and get the grace period
            if self._rank_died(-1 - rank, wait.pending, wait.replies):
                wait.dead.add(-1 - rank)
                if wait.stopping_since is None:  # the others are told why, then interrupted
                    self._signal(wait.peer_died(time.monotonic()), signal.SIGINT)
            return
        try:
            data = self._conns[rank].recv_bytes()
        except (EOFError, OSError):
            return  # its sentinel reports the death
        if int.from_bytes(data[:8], "little") != self._seq:
            return  # the late reply of an earlier request
        reply: CellReply = cloudpickle.loads(data[8:])
        wait.pending.discard(rank)
        wait.replies[rank].record(reply)
        if wait.replies[rank].status not in ("ok", "interrupted") and wait.first_failure is None:
            wait.first_failure = time.monotonic()

    def _kill_stuck(self, wait: ReplyWait, timeout: float) -> None:
        """Ranks that did not stop within the grace period are killed, and the set stopped."""
        for rank in sorted(wait.pending):
            wait.replies[rank].killed(timeout, GRACE_S)
        self.stop("a rank died or did not stop")

    def _interrupt(
        self, pending: set[int], replies: dict[int, RankReply], reason: StopReason, timeout: float
    ) -> None:
        if reason == "timeout" and hasattr(signal, "SIGUSR1"):
            self._dump_stacks(pending, replies, timeout)
        for rank in pending:
            replies[rank].stop_reason = reason
        self._signal(pending, signal.SIGINT)

    def _dump_stacks(
        self, pending: set[int], replies: dict[int, RankReply], timeout: float
    ) -> None:
        """Ask each of ``pending`` for its Python stack (SIGUSR1) and file it in its reply."""
        files = {r: self._rank_file(r, "stack") for r in pending}
        before = {r: os.path.getsize(f) if os.path.exists(f) else 0 for r, f in files.items()}
        self._signal(pending, signal.SIGUSR1)  # each rank's Python stack, into its stack file
        # a signal that arrives while another is pending may go to a thread that is not the
        # main one (a sleeping main thread would then never see it): one at a time
        time.sleep(0.1)
        for rank in pending:  # only what this dump added (earlier deadlines wrote there too)
            stack = read_text(files[rank])[before[rank] :].strip().splitlines()
            cut = next(
                (i for i, line in enumerate(stack) if _rank_server.__file__ in line), len(stack)
            )  # the cell's frames come first; the server's are noise
            replies[rank].stack = "\n".join(stack[:cut])
            replies[rank].deadline = timeout

    def _signal(self, ranks: Iterable[int], signum: int) -> None:
        for rank in sorted(ranks):
            pid = self.procs[rank].pid
            try:
                if pid is not None:
                    os.kill(pid, signum)
            except ProcessLookupError:
                pass

    def _rank_died(self, rank: int, pending: set[int], replies: dict[int, RankReply]) -> bool:
        proc = self.procs[rank]
        proc.join(timeout=1.0)
        if proc.exitcode is None:
            return False
        pending.discard(rank)
        tail = read_text(self._rank_file(rank, "err")).rstrip().splitlines()[-10:]
        text = describe_exit(proc.exitcode)
        if tail:
            text += "\nlast lines of its stderr:\n" + "\n".join(tail)
        reply = replies.setdefault(rank, RankReply())
        reply.status, reply.error = "died", text
        return True
