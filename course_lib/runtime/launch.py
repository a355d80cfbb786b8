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
   launch works. Stopping is SIGTERM, a grace period of ``_STOP_GRACE_S`` for every rank, then
   SIGKILL; further interrupts that arrive while the launcher stops the ranks are held until it
   is done, so a second press of "interrupt" cannot leave ranks running.

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
leaked ranks, and :func:`shutdown_forkserver` stops the forkserver when you want a clean slate.

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

import functools
import math
import multiprocessing
import multiprocessing.connection
import multiprocessing.forkserver
import multiprocessing.resource_tracker
import multiprocessing.spawn
import numbers
import os
import shutil
import signal
import sys
import threading
import time
from typing import Any, Callable

import psutil
import torch.multiprocessing

from course_lib.runtime import _worker
from course_lib.runtime._outcomes import (
    _emit_output,
    _error_outcome,
    _launch_error,
    _read_outcome,
    _read_result,
    _read_text,
)
from course_lib.runtime._payload import _LARGE_PAYLOAD_BYTES, _pickle_payload, _warn_large_payload
from course_lib.runtime._torchrun import (
    _launch_in_torchrun,
    _under_torchrun,
    _warn_about_tutorial_variables,
)
from course_lib.runtime._workdir import _new_workdir, _reclaim_stale_workdirs
from course_lib.runtime.device import check_backend_name, resolve_backend

# Imported once by the forkserver so that forked ranks start with torch already loaded.
# Imported once in the forkserver, then inherited by every rank for free. torch._dynamo (which
# brings torch.distributed.tensor) costs ~1.4 s on an idle core: paid once per kernel here instead
# of once per rank in every launch that builds DDP, DTensor or a CommMeter (units 08-13).
# The trampoline comes first: it makes the server exit quietly if interrupted while it imports
# the rest (an interrupted first launch used to print the server's own 30-line traceback).
_FORKSERVER_PRELOAD = [
    "course_lib.runtime._worker",
    "torch",
    "torch.distributed",
    "torch._dynamo",
    "torch.distributed.tensor",
    "cloudpickle",
]
_START_ALLOWANCE_S = (10.0, 60.0)  # time for every rank to start: warm forkserver / cold start
_END_SLACK_S = 1.0  # after `timeout`, time for a rank's own timeout error to arrive
_FAILURE_GRACE_S = 1.0  # after one rank fails, time the others get to report their own outcome
_STOP_GRACE_S = 1.0  # SIGTERM, then SIGKILL after this long
_MEMORY_SAMPLE_S = 0.25  # how often the caller notes each running rank's memory use


def launch(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    backend: str = "auto",
    timeout: float = 60.0,
    threads_per_rank: int = 1,
    **kwargs: Any,
) -> list:
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
    if _under_torchrun():
        return _launch_in_torchrun(fn, world_size, args, kwargs, backend, timeout)
    _warn_about_tutorial_variables(world_size)
    resolved = resolve_backend(backend, world_size)
    payload = _pickle_payload(fn, args, kwargs)
    if len(payload) > _LARGE_PAYLOAD_BYTES:
        _warn_large_payload(fn, args, kwargs, len(payload))
    return _run_ranks(payload, world_size, resolved, timeout, threads_per_rank)


# ----------------------------------------------------------------------------- argument checks


def _check_arguments(fn, world_size, backend, timeout, threads_per_rank) -> tuple[int, float, int]:
    if not callable(fn):
        raise TypeError(
            f"fn must be callable, called as fn(rank, world_size, *args, **kwargs); "
            f"got {fn!r} of type {type(fn).__name__}"
        )
    world_size = _positive_int("world_size", world_size, "the number of ranks, e.g. 1, 2 or 4")
    threads_per_rank = _positive_int(
        "threads_per_rank", threads_per_rank, "intra-op threads per rank, e.g. 1"
    )
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
        raise TypeError(
            f"timeout must be a positive number of seconds, e.g. 60.0; got {timeout!r} "
            f"of type {type(timeout).__name__}"
        )
    if not (math.isfinite(timeout) and timeout > 0):
        raise ValueError(
            f"timeout must be a positive, finite number of seconds, e.g. 60.0; got {timeout!r}"
        )
    check_backend_name(backend)  # spelling only; GPU counts are checked once the mode is known
    return world_size, float(timeout), threads_per_rank


def _positive_int(name: str, value, hint: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(
            f"{name} must be a positive int ({hint}); got {value!r} of type {type(value).__name__}"
        )
    if value < 1:
        raise ValueError(f"{name} must be a positive int ({hint}); got {value!r}")
    return int(value)


# ----------------------------------------------------------------------------- processes


def helper_pids() -> set[int]:
    """Pids of multiprocessing's long-lived helper processes (forkserver, resource tracker).

    They are children of the caller but not ranks: the forkserver is kept warm on purpose (the
    next launch then takes ~0.1 s instead of seconds) and exits when the caller exits.
    """
    pids = set()
    forkserver_pid = getattr(multiprocessing.forkserver._forkserver, "_forkserver_pid", None)
    tracker_pid = getattr(multiprocessing.resource_tracker._resource_tracker, "_pid", None)
    for pid in (forkserver_pid, tracker_pid):
        if pid is not None:
            pids.add(pid)
    return pids


def shutdown_forkserver() -> None:
    """Stop the warm forkserver (the next launch starts a new one and pays ~2 s once more)."""
    server = multiprocessing.forkserver._forkserver
    if getattr(server, "_forkserver_pid", None) is not None:
        server._stop()  # the stdlib's own (private) stop: closes the "alive" pipe and waits


def _forkserver_running() -> bool:
    """Whether the forkserver is up. Its pid alone does not say: an interrupted first launch
    leaves the pid of a server that exited (the stdlib restarts it on its next use)."""
    pid = getattr(multiprocessing.forkserver._forkserver, "_forkserver_pid", None)
    if pid is None:
        return False
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _start_method() -> str:
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return "spawn"
    if not _forkserver_running():
        server = multiprocessing.forkserver._forkserver
        # Preload torch and the trampoline, so every rank is a fork of a process that has them.
        current = list(getattr(server, "_preload_modules", []))
        server.set_forkserver_preload(list(dict.fromkeys(current + _FORKSERVER_PRELOAD)))
        # Tell the preloaded trampoline which main module to import once in the server (see
        # _worker._import_caller_main), and that it is being preloaded; the server inherits the
        # environment it starts with.
        prep = multiprocessing.spawn.get_preparation_data("course_lib")
        main = (
            f"name:{prep['init_main_from_name']}"
            if "init_main_from_name" in prep
            else f"path:{prep['init_main_from_path']}"
            if "init_main_from_path" in prep
            else None
        )
        if main is not None:
            os.environ[_worker.FORKSERVER_MAIN_ENV] = main
        os.environ[_worker.FORKSERVER_PRELOAD_ENV] = "1"
        try:
            multiprocessing.forkserver.ensure_running()
        finally:
            os.environ.pop(_worker.FORKSERVER_MAIN_ENV, None)
            os.environ.pop(_worker.FORKSERVER_PRELOAD_ENV, None)
    return "forkserver"


def _child_start_method() -> str | None:
    """The multiprocessing start method ranks use for their own children (DataLoader workers).

    Ranks would inherit the forkserver method, which pickles a DataLoader's Dataset by reference,
    and a class defined in a notebook cell (``__main__.DS``) cannot be found that way. ``fork``
    copies it instead, as in any Linux training script. A method the caller chose explicitly
    is kept; macOS keeps its default (fork is unsafe there).
    """
    chosen = multiprocessing.get_start_method(allow_none=True)
    if chosen is not None:
        return chosen
    if sys.platform.startswith("linux") and "fork" in multiprocessing.get_all_start_methods():
        return "fork"
    return None


@functools.lru_cache(maxsize=1)
def _loopback_interface() -> str | None:
    """Name of the loopback network interface ("lo" on Linux, "lo0" on macOS), if any."""
    try:
        interfaces = psutil.net_if_addrs()
    except Exception:  # no interface list on this platform: gloo picks its own
        return None
    for name, addresses in interfaces.items():
        if any(a.address in ("127.0.0.1", "::1") for a in addresses):
            return name
    return None


def _caller_sys_path() -> list:
    """The caller's import path as it resolves now: ``''`` is the *current* directory.

    multiprocessing replaces ``''`` with the directory the caller *started* in, so after
    ``%cd sub`` a module in ``sub`` imported in the notebook but not in the ranks.
    """
    cwd = os.getcwd()
    return [cwd if entry == "" else entry for entry in sys.path]


# ----------------------------------------------------------------------------- interrupts


class _InterruptGuard:
    """SIGINT (Ctrl-C, "interrupt kernel") around one launch, in the main thread.

    While the launch runs, an interrupt raises KeyboardInterrupt as usual. Once ``hold()`` is
    called (cleanup has begun, or ranks are being handed to a warm forkserver), interrupts are
    held instead: a second press of "interrupt" must not cut short the SIGTERM grace period and
    skip SIGKILL, leaving ranks running. On exit the previous handler is back, and a held
    interrupt is raised then, unless an exception is already on its way out.
    """

    def __init__(self):
        self.holding = False
        self.held = False
        self._previous = None
        self._installed = False

    def __enter__(self) -> _InterruptGuard:
        if threading.current_thread() is threading.main_thread():
            previous = signal.getsignal(signal.SIGINT)
            if callable(previous):  # default_int_handler, or IPython's: wrap it
                self._previous = previous
                signal.signal(signal.SIGINT, self._handle)
                self._installed = True
        return self

    def _handle(self, signum, frame) -> None:
        if self.holding:
            self.held = True
            return
        self._previous(signum, frame)

    def hold(self) -> None:
        self.holding = True

    def release(self) -> None:
        """Stop holding; raise KeyboardInterrupt now if one arrived meanwhile."""
        self.holding = False
        if self.held:
            self.held = False
            raise KeyboardInterrupt

    def __exit__(self, exc_type, exc, tb) -> bool:
        if self._installed:
            signal.signal(signal.SIGINT, self._previous)
        if self.held and exc_type is None:
            raise KeyboardInterrupt
        return False


# ----------------------------------------------------------------------------- running ranks


def _run_ranks(payload: bytes, world_size: int, backend: str, timeout: float, threads: int) -> list:
    _reclaim_stale_workdirs()
    warm = _forkserver_running()
    method = _start_method()
    warm = warm and method == "forkserver"  # else every rank imports torch first
    workdir = _new_workdir()
    spec = {
        "payload": payload,
        "world_size": world_size,
        "backend": backend,
        "timeout": timeout,
        "threads": threads,
        "workdir": workdir,
        "env": dict(os.environ),
        "sys_path": _caller_sys_path(),
        "child_start_method": _child_start_method(),
        "loopback_interface": _loopback_interface(),
    }
    procs: list = []
    memory: dict[int, tuple[int, int, int]] = {}
    before = {p.pid for p in multiprocessing.active_children()}
    with _InterruptGuard() as interrupts:
        try:
            if warm:  # a warm forkserver hands out ranks in milliseconds: not worth a half start
                interrupts.hold()
            try:
                context = torch.multiprocessing.start_processes(
                    _worker.run_rank,
                    args=(spec,),
                    nprocs=world_size,
                    join=False,
                    daemon=False,  # daemonic ranks could not start DataLoader workers
                    start_method=method,
                )
            except BaseException:
                # interrupted half-way through starting: stop whatever did start
                interrupts.hold()
                _stop([p for p in multiprocessing.active_children() if p.pid not in before])
                raise
            procs = context.processes
            interrupts.release()
            outcomes = _wait(procs, workdir, timeout, _START_ALLOWANCE_S[0 if warm else 1], memory)
        finally:
            interrupts.hold()  # from here on, an interrupt waits until every rank is gone
            _stop(procs)
            if procs:  # also after Ctrl-C: what the ranks printed until then
                _emit_output(workdir, world_size)
            for p in procs:
                try:
                    p.close()  # releases the sentinel fd now, not at garbage collection
                except ValueError:  # still running after SIGKILL (uninterruptible I/O)
                    pass
            shutil.rmtree(workdir, ignore_errors=True)
    failed = {r: o for r, o in outcomes.items() if o[0] != "ok"}
    if failed:
        raise _launch_error(outcomes, timeout)
    return [outcomes[r][1] for r in range(world_size)]


def _note_memory(procs: list, ranks, memory: dict) -> None:
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


def _wait(
    procs: list, workdir: str, timeout: float, start_allowance: float, memory: dict | None = None
) -> dict[int, tuple]:
    """Wait for the ranks; return rank -> outcome tuple:
    ("ok", value) | ("error", time, text) | ("stopped", reason).

    Two deadlines: every rank must have *started* (its trampoline created its files) within
    ``start_allowance`` s, and must have finished ``timeout`` s (+ a little slack for teardown)
    after the last rank started. So a hung run is reported ``timeout`` s after it really began,
    whether the processes took 0.05 s (warm forkserver) or 10 s (cold spawn) to start.
    Every ``_MEMORY_SAMPLE_S`` the running ranks' memory use goes into ``memory``, so that a
    rank the out-of-memory killer takes can be reported with it.
    """
    memory = {} if memory is None else memory
    pending = {p.sentinel: rank for rank, p in enumerate(procs)}
    outcomes: dict[int, tuple] = {}
    started: set[int] = set()
    deadline = time.monotonic() + start_allowance
    next_sample = time.monotonic()
    first_failure = None  # (monotonic time, rank)
    while pending:
        if len(started) < len(procs):  # still checking who has started, every 50 ms
            started |= {
                r
                for r in range(len(procs))
                if r not in started and os.path.exists(_worker.rank_file(workdir, r, "stack"))
            }
            if len(started) == len(procs):
                deadline = time.monotonic() + timeout + _END_SLACK_S
        if time.monotonic() >= next_sample:
            _note_memory(procs, pending.values(), memory)
            next_sample = time.monotonic() + _MEMORY_SAMPLE_S
        limit = (
            deadline
            if first_failure is None
            else min(deadline, first_failure[0] + _FAILURE_GRACE_S)
        )
        remaining = limit - time.monotonic()
        if remaining <= 0:
            break
        if len(started) < len(procs):
            remaining = min(remaining, 0.05)
        remaining = min(remaining, max(0.0, next_sample - time.monotonic()))
        for sentinel in multiprocessing.connection.wait(list(pending), timeout=remaining):
            rank = pending.pop(sentinel)
            procs[rank].join()
            started.add(rank)
            outcomes[rank] = _read_outcome(workdir, rank, procs[rank].exitcode, memory.get(rank))
            if outcomes[rank][0] != "ok" and first_failure is None:
                first_failure = (time.monotonic(), rank)
    for rank in sorted(pending.values()):
        record = _read_result(workdir, rank)
        if record is not None and record[0] == "ok":
            outcomes[rank] = (
                "ok",
                record[1],
                "returned, then waited for the other ranks to return",
            )
        elif record is not None:
            outcomes[rank] = _error_outcome(record)  # raised; stopped while exiting
        elif first_failure is not None:
            outcomes[rank] = (
                "stopped",
                f"stopped by the launcher after rank {first_failure[1]} failed",
            )
        elif rank not in started:
            outcomes[rank] = (
                "error",
                float("inf"),
                f"did not start within {start_allowance:g} s "
                "(machine overloaded?); stopped by the launcher",
            )
        else:
            stack = _read_text(_worker.rank_file(workdir, rank, "stack")).strip()
            text = (
                f"still running at the deadline (timeout={timeout:g} s): hung, too slow, or "
                "waiting in a collective that a peer never entered; stopped by the launcher"
            )
            if stack:
                text += f"\nits Python stack at the deadline:\n{stack}"
            outcomes[rank] = ("error", float("inf"), text)
    return outcomes


def _stop(procs: list) -> None:
    """Terminate (then kill) every rank still running, and any child processes they started."""
    alive = [p for p in procs if p.exitcode is None]
    if not alive:
        return
    descendants = []
    for p in alive:
        try:
            descendants += psutil.Process(p.pid).children(recursive=True)
        except psutil.Error:
            pass
    for p in alive:
        p.terminate()  # SIGTERM
    for d in descendants:
        try:
            d.terminate()
        except psutil.Error:
            pass
    _wait_all([p.sentinel for p in alive], _STOP_GRACE_S)  # every rank gets the whole grace
    for p in alive:
        if p.exitcode is None:
            p.kill()  # SIGKILL: a rank stuck in C++ (a collective) may not act on SIGTERM
        p.join(timeout=5.0)
    _, still = psutil.wait_procs(descendants, timeout=_STOP_GRACE_S)
    for d in still:
        try:
            d.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(still, timeout=_STOP_GRACE_S)


def _wait_all(sentinels: list, timeout: float) -> None:
    """Wait until every sentinel is ready or ``timeout`` s have passed.
    (``multiprocessing.connection.wait`` alone returns as soon as the *first* one is ready.)"""
    deadline = time.monotonic() + timeout
    pending = list(sentinels)
    while pending:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return
        ready = multiprocessing.connection.wait(pending, timeout=remaining)
        pending = [s for s in pending if s not in ready]
