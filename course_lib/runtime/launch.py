"""Run one function on N ranks, from a notebook cell: ``course_lib.launch(fn, world_size)``.

Introduced in notebooks/00_start_here.ipynb; every multi-rank unit (08 collectives onwards)
runs its experiments through it.

    import torch, torch.distributed as dist, course_lib

    def fn(rank, world_size):
        t = torch.tensor([rank + 1.0], device=course_lib.rank_device())
        dist.all_reduce(t)                  # the default process group is ready
        print("sum", t.item())              # shows up as "[rank r] sum 10.0" in the notebook
        return t.item()

    course_lib.launch(fn, 4)                # -> [10.0, 10.0, 10.0, 10.0], in rank order

How it works, in the order things happen:

1. Arguments are checked in the caller before any process starts (ValueError/TypeError naming
   the parameter, the bad value and the valid choices).
2. ``fn`` and its arguments are serialised *by value* with cloudpickle, so a function defined in
   a notebook cell or a script's ``__main__`` works. A module-level trampoline
   (``course_lib.runtime._worker.run_rank``) unpacks and calls it in each rank.
3. Ranks start with ``torch.multiprocessing.start_processes``, using the ``forkserver`` start
   method where the platform has it (Linux, macOS) and ``spawn`` elsewhere. The forkserver is a
   helper process that imports torch once (we preload torch and the trampoline into it); each
   rank is then a ``fork()`` of that clean, thread-free helper, so a warm launch costs ~0.1 s
   instead of the ~2 s a ``spawn`` pays to import torch in every rank. Each rank uses one
   intra-op thread by default (``threads_per_rank``), so 4 ranks do not fight over 2 cores.
4. The ranks meet through a ``FileStore`` in the launch's private temporary directory: no
   MASTER_PORT, no port race, and two notebooks launching at the same moment never collide.
   No name service is asked anything either: a ``TCPStore`` made c10d reverse-resolve
   ``::ffff:127.0.0.1`` on every connection, and one DNS query lost by the resolver cost a
   launch 5 s (glibc's retry time-out); gloo talks over the loopback interface, named
   explicitly (``GLOO_SOCKET_IFNAME``, unless you set it), instead of resolving the host name.
   gloo runs on CPU; NCCL only with one GPU per rank (``backend="auto"`` picks; see
   ``device.py``).
5. Each rank's stdout/stderr (file descriptors 1 and 2, so C++ warnings too) goes to its own
   file; after the run the caller prints it, prefixed ``[rank r]``, in rank order, so the
   output of a cell is the same from run to run.
6. Every rank waits (in the store, not in a collective) until all have joined the process
   group before ``fn`` starts, and a rank that returns waits until every rank has returned, so
   an early exit never breaks a peer still connecting to it or inside a collective with it.
7. The caller waits on the ranks with a deadline. A rank that raises, dies by a signal, or is
   still running ``timeout`` seconds after the ranks started stops the run: the other ranks are
   terminated and :class:`~course_lib.LaunchError` names every rank and what happened to it
   (a hung rank's Python stack included). ``timeout`` is also the process group's collective
   timeout, so a skipped collective fails in seconds, not after PyTorch's 30-minute default.
   Ctrl-C / "interrupt kernel" stops every rank and re-raises KeyboardInterrupt; the next
   launch works. Stopping is SIGTERM, a grace period of ``processes.STOP_GRACE_S`` for every rank, then
   SIGKILL; further interrupts that arrive while the launcher stops the ranks are held until it
   is done, so a second press of "interrupt" cannot leave ranks running. (The process machinery
   is shared with the persistent ranks of ``%%ranks``: ``processes.py``.)

What a rank sees: the caller's current environment and working directory, and the caller's
``sys.path`` with ``''`` read as the caller's *current* directory (after ``%cd sub`` a module in
``sub`` imports in the ranks as in the notebook). Processes a rank starts through
multiprocessing (DataLoader workers) are forked on Linux unless the caller chose a start method,
so a Dataset class defined in a notebook cell works with ``num_workers > 0``.

Leftover files: each launch works in ``<tempdir>/course_lib_launch_pid<caller pid>_*``, removed
when the launch ends; a directory whose owner died (a kernel restarted mid-launch) is removed by
the next launch.

Leftover processes: after every return or raise no rank (nor any child of a rank) remains.
Two long-lived *helpers* of Python's multiprocessing stay up on purpose: the forkserver (it is
what makes the next launch fast; it exits by itself when the caller exits) and the resource
tracker that comes with it. :func:`helper_pids` returns their pids so tests can tell them from
leaked ranks, and :func:`shutdown_forkserver` stops the forkserver when you want a clean slate
(both live in ``processes.py`` and are re-exported here).

Outgrowing the notebook. ``fn(rank, world_size, ...)`` is an ordinary torch.distributed worker;
on a multi-GPU node, or on several nodes, run the same function under torchrun::

    # train.py  (in a script, keep the launch under the __main__ guard, as for any multiprocessing)
    import os, course_lib
    def fn(rank, world_size): ...
    if __name__ == "__main__":
        world_size = int(os.environ.get("WORLD_SIZE", 4))  # torchrun sets it; 4 ranks otherwise
        print(course_lib.launch(fn, world_size))

    python train.py                                  # laptop: 4 gloo ranks started by launch
    torchrun --standalone --nproc-per-node 8 train.py                 # one node, 8 GPUs (NCCL)
    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d \\
             --rdzv-endpoint "$HEAD_NODE:$PORT" --rdzv-id run1 train.py   # on each of 2 nodes

Under torchrun (detected from TORCHELASTIC_RUN_ID, which torchrun alone sets, with RANK and
WORLD_SIZE) each process already *is* one rank, so :func:`launch` starts nothing: it initialises the
default process group from the environment if nobody has yet (and keeps it until the script
exits, so later launches reuse it), runs ``fn`` once for this rank,
all-gathers every rank's return value (``all_gather_object``) and returns the full list in rank
order on every rank, exactly as in the notebook. ``world_size`` must then equal torchrun's
WORLD_SIZE. Output is not captured there: use torchrun's own ``--tee 3`` / ``--log-dir``.
RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set by hand (copied from a DDP tutorial into a
notebook) do not make a torchrun job: launch starts its ranks as usual and warns that it
ignored them.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from typing import Any, cast

import psutil
import torch.multiprocessing

from course_lib import validate
from course_lib.runtime import _worker, processes
from course_lib.runtime._outcomes import (
    Outcome,
    emit_output,
    launch_error,
    read_outcome,
    read_result,
    read_text,
)
from course_lib.runtime._payload import _LARGE_PAYLOAD_BYTES, _pickle_payload, _warn_large_payload
from course_lib.runtime._torchrun import (
    _launch_in_torchrun,
    _under_torchrun,
    _warn_about_tutorial_variables,
)
from course_lib.runtime._workdir import _new_workdir, _reclaim_stale_workdirs, _remove_workdir
from course_lib.runtime.device import check_backend_name, resolve_backend
from course_lib.runtime.dry_run import stop_if_checking
from course_lib.runtime.interrupts import Interrupted
from course_lib.runtime.processes import helper_pids, shutdown_forkserver
from course_lib.runtime.protocol import Backend, BackendChoice, RankSpec

__all__ = ["launch", "helper_pids", "shutdown_forkserver"]

Memory = tuple[int, int, int]  # a rank's resident bytes, the system's available and total bytes

_END_SLACK_S = 1.0  # after `timeout`, time for a rank's own timeout error to arrive
_FAILURE_GRACE_S = 1.0  # after one rank fails, time the others get to report their own outcome
_MEMORY_SAMPLE_S = 0.25  # how often the caller notes each running rank's memory use


def launch(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    backend: BackendChoice = "auto",
    timeout: float = 60.0,
    threads_per_rank: int = 1,
    **kwargs: Any,
) -> list[Any]:
    """Run ``fn(rank, world_size, *args, **kwargs)`` on ``world_size`` ranks; return their
    return values as a list in rank order.

    Args:
        fn: any picklable-by-value callable (a notebook or ``__main__`` function is fine).
        world_size: number of ranks (processes), a positive int.
        *args, **kwargs: passed to every rank's ``fn`` after ``rank, world_size``. They travel
            by cloudpickle, so they must be picklable. (``backend``, ``timeout`` and
            ``threads_per_rank`` are taken by launch itself, not passed on.)
        backend: "auto" (NCCL with one GPU per rank if there are >= world_size GPUs, else
            gloo on CPU), "gloo" or "nccl".
        timeout: seconds, > 0. Bounds every collective (process-group timeout) *and* the whole
            run: ranks still running ``timeout`` s after they all started (process start-up
            is not counted) are stopped and reported, with their Python stacks.
        threads_per_rank: intra-op threads per rank (``torch.set_num_threads``), a positive int.

    Raises:
        TypeError / ValueError: bad arguments, before any process starts.
        LaunchError: a rank raised, died by a signal or timed out; ``.failures`` maps each such
            rank to its exception type, message and traceback (or signal / stack at the deadline).
        KeyboardInterrupt: after stopping every rank, when the caller is interrupted.
    """
    world_size, timeout, threads_per_rank = _check_arguments(
        fn, world_size, backend, timeout, threads_per_rank
    )
    if os.environ.get(_worker.RANK_MARKER_ENV):
        raise RuntimeError(
            "course_lib.launch() was called inside a rank of another launch(); "
            "nested launches are not supported: run the inner work directly"
        )
    stop_if_checking()  # dry_run.check_arguments: the caller's checks passed, start nothing
    if _under_torchrun():
        return _launch_in_torchrun(fn, world_size, args, kwargs, backend, timeout)
    try:  # an interrupt is shown in one line: the launcher's own stack says nothing about fn
        _warn_about_tutorial_variables(world_size)
        resolved = resolve_backend(backend, world_size)
        payload = _pickle_payload(fn, args, kwargs)
        if len(payload) > _LARGE_PAYLOAD_BYTES:
            _warn_large_payload(fn, args, kwargs, len(payload))
        return _run_ranks(payload, world_size, resolved, timeout, threads_per_rank)
    except KeyboardInterrupt:
        raise Interrupted("course_lib.launch was interrupted; no rank was left running") from None


# ----------------------------------------------------------------------------- argument checks


def _check_arguments(
    fn: object, world_size: object, backend: object, timeout: object, threads_per_rank: object
) -> tuple[int, float, int]:
    if not callable(fn):
        raise TypeError(
            f"fn = {validate.describe(fn)}: expected a callable, called as "
            f"fn(rank, world_size, *args, **kwargs) (got {type(fn).__name__})"
        )
    world_size = validate.count("world_size", world_size, minimum=1)
    threads_per_rank = validate.count("threads_per_rank", threads_per_rank, minimum=1)
    timeout = validate.number("timeout", timeout, positive=True, maximum=86400.0)
    check_backend_name(backend)  # spelling only; GPU counts are checked once the mode is known
    return world_size, float(timeout), threads_per_rank


# ----------------------------------------------------------------------------- running ranks


def _start_ranks(
    spec: RankSpec, method: str, interrupts: processes.InterruptGuard
) -> list[BaseProcess]:
    """Start ``spec.world_size`` ranks; if interrupted half-way, stop whatever did start."""
    before = {p.pid for p in multiprocessing.active_children()}
    try:
        context = torch.multiprocessing.start_processes(
            _worker.run_rank,
            args=(spec,),
            nprocs=spec.world_size,
            join=False,
            daemon=False,  # daemonic ranks could not start DataLoader workers
            start_method=method,
        )
    except BaseException:
        interrupts.hold()
        processes.stop_processes(
            [p for p in multiprocessing.active_children() if p.pid not in before]
        )
        raise
    assert context is not None  # join=False always returns the context
    return list(context.processes)


def _close(procs: list[BaseProcess]) -> None:
    for p in procs:
        try:
            p.close()  # releases the sentinel fd now, not at garbage collection
        except ValueError:  # still running after SIGKILL (uninterruptible I/O)
            pass


def _run_ranks(
    payload: bytes, world_size: int, backend: Backend, timeout: float, threads: int
) -> list[Any]:
    _reclaim_stale_workdirs()
    warm = processes.forkserver_running()
    method = processes.start_method()
    warm = warm and method == "forkserver"  # else every rank imports torch first
    workdir = _new_workdir()
    spec = processes.rank_spec(world_size, backend, timeout, threads, workdir, payload)
    procs: list[BaseProcess] = []
    with processes.InterruptGuard() as interrupts:
        try:
            if warm:  # a warm forkserver hands out ranks in milliseconds: not worth a half start
                interrupts.hold()
            procs = _start_ranks(spec, method, interrupts)
            interrupts.release()
            allowance = processes.START_ALLOWANCE_S[0 if warm else 1]
            outcomes = _wait(procs, workdir, timeout, allowance)
        finally:
            interrupts.hold()  # from here on, an interrupt waits until every rank is gone
            processes.stop_processes(procs)
            if procs:  # also after Ctrl-C: what the ranks printed until then
                emit_output(workdir, world_size)
            _close(procs)
            _remove_workdir(workdir)
    if any(o.kind != "ok" for o in outcomes.values()):
        raise launch_error(outcomes)
    return [outcomes[r].value for r in range(world_size)]


def _note_memory(procs: list[BaseProcess], ranks: Iterable[int], memory: dict[int, Memory]) -> None:
    """Record each running rank's resident memory and the system's available memory."""
    try:
        system = psutil.virtual_memory()
    except Exception:
        return
    for rank in ranks:
        try:
            rss = psutil.Process(procs[rank].pid).memory_info().rss
        except (psutil.Error, ValueError):
            continue
        if rss > 0:  # a rank that just died (a zombie) reports 0: keep its last real figure
            memory[rank] = (rss, system.available, system.total)


@dataclass
class _Watch:
    """The caller's view of running ranks while :func:`_wait` waits on them."""

    procs: list[BaseProcess]
    workdir: str
    deadline: float  # until every rank has started: the start deadline; then the run's
    pending: dict[int, int] = field(default_factory=dict)  # sentinel -> rank, still running
    outcomes: dict[int, Outcome] = field(default_factory=dict)
    started: set[int] = field(default_factory=set)
    memory: dict[int, Memory] = field(default_factory=dict)
    first_failure: tuple[float, int] | None = None  # (monotonic time, rank)

    def all_started(self) -> bool:
        return len(self.started) == len(self.procs)

    def note_started(self, timeout: float) -> None:
        """A rank has started once its trampoline created its stack file."""
        self.started |= {
            r
            for r in range(len(self.procs))
            if r not in self.started and os.path.exists(_worker.rank_file(self.workdir, r, "stack"))
        }
        if self.all_started():
            self.deadline = time.monotonic() + timeout + _END_SLACK_S

    def limit(self) -> float:
        if self.first_failure is None:
            return self.deadline
        return min(self.deadline, self.first_failure[0] + _FAILURE_GRACE_S)

    def collect(self, sentinel: int) -> None:
        """The rank behind ``sentinel`` exited: read its outcome."""
        rank = self.pending.pop(sentinel)
        proc = self.procs[rank]
        proc.join()
        self.started.add(rank)
        assert proc.exitcode is not None  # joined
        outcome = read_outcome(self.workdir, rank, proc.exitcode, self.memory.get(rank))
        self.outcomes[rank] = outcome
        if outcome.kind != "ok" and self.first_failure is None:
            self.first_failure = (time.monotonic(), rank)


def _wait(
    procs: list[BaseProcess], workdir: str, timeout: float, start_allowance: float
) -> dict[int, Outcome]:
    """Wait for the ranks; return rank -> :class:`Outcome`.

    Two deadlines: every rank must have *started* (its trampoline created its files) within
    ``start_allowance`` s, and must have finished ``timeout`` s (+ a little slack for teardown)
    after the last rank started. So a hung run is reported ``timeout`` s after it really began,
    whether the processes took 0.05 s (warm forkserver) or 10 s (cold spawn) to start.
    Every ``_MEMORY_SAMPLE_S`` the running ranks' memory use is noted, so that a rank the
    out-of-memory killer takes can be reported with it.
    """
    watch = _Watch(procs, workdir, time.monotonic() + start_allowance)
    watch.pending = {p.sentinel: rank for rank, p in enumerate(procs)}
    next_sample = time.monotonic()
    while watch.pending:
        if not watch.all_started():  # still checking who has started, every 50 ms
            watch.note_started(timeout)
        if time.monotonic() >= next_sample:
            _note_memory(procs, watch.pending.values(), watch.memory)
            next_sample = time.monotonic() + _MEMORY_SAMPLE_S
        remaining = watch.limit() - time.monotonic()
        if remaining <= 0:
            break
        if not watch.all_started():
            remaining = min(remaining, 0.05)
        remaining = min(remaining, max(0.0, next_sample - time.monotonic()))
        for sentinel in multiprocessing.connection.wait(list(watch.pending), timeout=remaining):
            watch.collect(cast(int, sentinel))  # we waited on sentinels, which are ints
    for rank in sorted(watch.pending.values()):
        watch.outcomes[rank] = _unfinished(watch, rank, timeout, start_allowance)
    return watch.outcomes


def _unfinished(watch: _Watch, rank: int, timeout: float, start_allowance: float) -> Outcome:
    """The outcome of a rank still running when the wait ended (it is about to be stopped)."""
    record = read_result(watch.workdir, rank)
    if record is not None:  # returned (and waited for its peers), or raised and was exiting
        return Outcome.from_result(record, "returned, then waited for the other ranks to return")
    if watch.first_failure is not None:
        return Outcome(
            "stopped", text=f"stopped by the launcher after rank {watch.first_failure[1]} failed"
        )
    if rank not in watch.started:
        return Outcome(
            "error",
            text=f"did not start within {start_allowance:g} s "
            "(machine overloaded?); stopped by the launcher",
        )
    stack = read_text(_worker.rank_file(watch.workdir, rank, "stack")).strip()
    text = (
        f"still running at the deadline (timeout={timeout:g} s): hung, too slow, or "
        "waiting in a collective that a peer never entered; stopped by the launcher"
    )
    if stack:
        text += f"\nits Python stack at the deadline:\n{stack}"
    return Outcome("error", text=text)
