"""The process machinery that :func:`course_lib.launch` and the persistent ranks of ``%%ranks``
(:class:`~course_lib.runtime.rankset.RankSet`) share: the warm forkserver and its start method,
what a rank inherits from the caller (:class:`~course_lib.runtime.protocol.RankSpec`), SIGINT
held while ranks are being stopped, and stopping (SIGTERM, a grace period, SIGKILL).
"""

from __future__ import annotations

import functools
import multiprocessing
import multiprocessing.connection
import multiprocessing.forkserver
import multiprocessing.resource_tracker
import multiprocessing.spawn
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable
from multiprocessing.process import BaseProcess
from types import FrameType, TracebackType
from typing import Any, Literal

import psutil

from course_lib.runtime import _worker
from course_lib.runtime.protocol import Backend, RankSpec, StartMethod

# Imported once by the forkserver so that forked ranks start with torch already loaded.
# Imported once in the forkserver, then inherited by every rank for free. torch._dynamo (which
# brings torch.distributed.tensor) costs ~1.4 s on an idle core: paid once per kernel here instead
# of once per rank in every launch that builds DDP, DTensor or a CommMeter (units 08-13).
# pandas likewise: a rank imports the module its function comes from, and the units' run
# modules import pandas for their tables (~0.3 s of CPU per rank, in every launch of a unit's
# experiment; the rest of such a module then costs a rank ~0.1 s).
# The trampoline comes first: it makes the server exit quietly if interrupted while it imports
# the rest (an interrupted first launch used to print the server's own 30-line traceback).
FORKSERVER_PRELOAD = [
    "course_lib.runtime._worker",
    "torch",
    "torch.distributed",
    "torch._dynamo",
    "torch.distributed.tensor",
    "cloudpickle",
    "pandas",
]
START_ALLOWANCE_S = (10.0, 60.0)  # time for every rank to start: warm forkserver / cold start
STOP_GRACE_S = 1.0  # SIGTERM, then SIGKILL after this long


def helper_pids() -> set[int]:
    """Pids of multiprocessing's long-lived helper processes (forkserver, resource tracker).

    They are children of the caller but not ranks: the forkserver is kept warm on purpose (the
    next launch then takes ~0.1 s instead of seconds) and exits when the caller exits.
    """
    pids: set[int] = set()
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
        # the stdlib's own (private, not in typeshed) stop: closes the "alive" pipe and waits
        getattr(server, "_stop")()  # noqa: B009


def forkserver_running() -> bool:
    """Whether the forkserver is up. Its pid alone does not say: an interrupted first launch
    leaves the pid of a server that exited (the stdlib restarts it on its next use)."""
    pid = getattr(multiprocessing.forkserver._forkserver, "_forkserver_pid", None)
    if pid is None:
        return False
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def start_method() -> StartMethod:
    """``forkserver`` (started now, torch preloaded, if it is not running) or ``spawn``."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return "spawn"
    if not forkserver_running():
        server = multiprocessing.forkserver._forkserver
        # Preload torch and the trampoline, so every rank is a fork of a process that has them.
        current = list(getattr(server, "_preload_modules", []))
        server.set_forkserver_preload(list(dict.fromkeys(current + FORKSERVER_PRELOAD)))
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
        # The server starts with SIGINT blocked (a signal mask survives fork and exec) until the
        # trampoline's quiet handler is in place: an interrupt during its interpreter's own
        # start-up then waits for that handler instead of printing the server's traceback.
        # (This thread only: the kernel's other threads still let Python see an interrupt.)
        multiprocessing.resource_tracker.ensure_running()  # first: it *unblocks* SIGINT after
        masked = hasattr(signal, "pthread_sigmask")
        before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT}) if masked else None
        try:
            multiprocessing.forkserver.ensure_running()
        finally:
            if before is not None:
                signal.pthread_sigmask(signal.SIG_SETMASK, before)
            os.environ.pop(_worker.FORKSERVER_MAIN_ENV, None)
            os.environ.pop(_worker.FORKSERVER_PRELOAD_ENV, None)
    return "forkserver"


def start_forkserver_by_fork() -> bool:
    """Start the forkserver as a ``fork()`` of this process: nothing is imported a second time.

    The stdlib starts the server as a new interpreter, which imports torch and the rest of
    :data:`FORKSERVER_PRELOAD` again (~5 s of CPU, a third of a grade on 2 cores). A process that
    has imported them already and runs one thread (the grader's zygote, before any check) can be
    the server's template instead: the server is then a copy of it, as the ranks are copies of the
    server. False, with nothing started, where that is not safe: another thread is running (a fork
    copies no thread, and a lock another thread held would stay locked), a server already runs,
    or the platform has no forkserver. The caller then starts one the usual way
    (:func:`start_method`).
    """
    import importlib
    import socket

    if "forkserver" not in multiprocessing.get_all_start_methods() or forkserver_running():
        return False
    for name in FORKSERVER_PRELOAD:  # what the server and every rank find imported
        importlib.import_module(name)
    multiprocessing.resource_tracker.ensure_running()  # a small interpreter of its own, as usual
    # One Python thread, and no OS thread but the idle one torch's import starts (the stdlib's
    # own server forks every rank with that one too)
    if threading.active_count() != 1 or _thread_count() > _TORCH_IMPORT_THREADS + 1:
        return False
    server = multiprocessing.forkserver._forkserver
    with socket.socket(socket.AF_UNIX) as listener:
        address = multiprocessing.connection.arbitrary_address("AF_UNIX")  # type: ignore[attr-defined]
        listener.bind(address)
        os.chmod(address, 0o600)
        listener.listen()
        alive_r, alive_w = os.pipe()  # the server exits when every holder of alive_w is gone
        pid = os.fork()
        if pid == 0:  # the server: keep only what a new interpreter would have been given
            try:
                low = 3
                for fd in sorted({listener.fileno(), alive_r}):
                    os.closerange(low, fd)
                    low = fd + 1
                os.closerange(low, os.sysconf("SC_OPEN_MAX"))
                signal.signal(signal.SIGINT, _worker._exit_quietly)  # as the preloaded trampoline
                multiprocessing.forkserver.main(listener.fileno(), alive_r, [])
            finally:
                os._exit(0)
        os.close(alive_r)
    server._forkserver_address = address  # type: ignore[attr-defined]
    server._forkserver_alive_fd = alive_w  # type: ignore[attr-defined]
    server._forkserver_pid = pid  # type: ignore[attr-defined]
    # a later restart (the stdlib's, if this server dies) preloads the same modules
    server.set_forkserver_preload(list(FORKSERVER_PRELOAD))
    return True


# Threads (blocked on a futex) that loading torch._C starts: 1, measured with torch 2.13.
_TORCH_IMPORT_THREADS = 1


def _thread_count() -> int:
    """Threads of this process as the OS counts them (C++ threads included); 1 where unknown."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


def adopt_inherited_forkserver() -> None:
    """In a process ``fork()``-ed from one whose forkserver runs: hand out ranks from that server.

    The stdlib checks that its server lives with ``waitpid``, which only a parent may call, so a
    forked child would fail on its first launch. Here the check is by pid (psutil) instead, and a
    child whose inherited server has died starts its own as usual. The grader's zygote warms one
    server while the learner's kernel runs; each clean child then launches in ~0.1 s instead of
    paying a cold start (torch imported again) per task."""
    server = multiprocessing.forkserver._forkserver
    inherited = getattr(server, "_forkserver_pid", None)
    if inherited is None:
        return
    stdlib_ensure_running = server.ensure_running

    def ensure_running() -> None:
        if getattr(server, "_forkserver_pid", None) == inherited:
            if forkserver_running():
                multiprocessing.resource_tracker.ensure_running()
                return
            # dead, and not our child: forget it, so the stdlib starts a server of our own
            server._forkserver_pid = None  # type: ignore[attr-defined]
            server._forkserver_address = None  # type: ignore[attr-defined]
        stdlib_ensure_running()

    server.ensure_running = ensure_running  # type: ignore[method-assign]
    multiprocessing.forkserver.ensure_running = ensure_running  # the module's alias of the method


def child_start_method() -> str | None:
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
def loopback_interface() -> str | None:
    """Name of the loopback network interface ("lo" on Linux, "lo0" on macOS), if any."""
    try:
        interfaces = psutil.net_if_addrs()
    except Exception:  # no interface list on this platform: gloo picks its own
        return None
    for name, addresses in interfaces.items():
        if any(a.address in ("127.0.0.1", "::1") for a in addresses):
            return str(name)
    return None


def caller_sys_path() -> list[str]:
    """The caller's import path as it resolves now: ``''`` is the *current* directory.

    multiprocessing replaces ``''`` with the directory the caller *started* in, so after
    ``%cd sub`` a module in ``sub`` imported in the notebook but not in the ranks.
    """
    cwd = os.getcwd()
    return [cwd if entry == "" else entry for entry in sys.path]


def rank_spec(
    world_size: int,
    backend: Backend,
    timeout: float,
    threads: int,
    workdir: str,
    payload: bytes = b"",
) -> RankSpec:
    """What every rank of one launch or rank set inherits from the caller, as it is now."""
    return RankSpec(
        world_size=world_size,
        backend=backend,
        timeout=timeout,
        threads=threads,
        workdir=workdir,
        env=dict(os.environ),
        sys_path=caller_sys_path(),
        child_start_method=child_start_method(),
        loopback_interface=loopback_interface(),
        payload=payload,
    )


# ----------------------------------------------------------------------------- interrupts


class InterruptGuard:
    """SIGINT (Ctrl-C, "interrupt kernel") around one launch, in the main thread.

    While the launch runs, an interrupt raises KeyboardInterrupt as usual. Once ``hold()`` is
    called (cleanup has begun, or ranks are being handed to a warm forkserver), interrupts are
    held instead: a second press of "interrupt" must not cut short the SIGTERM grace period and
    skip SIGKILL, leaving ranks running. On exit the previous handler is back, and a held
    interrupt is raised then, unless an exception is already on its way out.
    """

    def __init__(self) -> None:
        self.holding = False
        self.held = False
        self._previous: Callable[[int, FrameType | None], Any] | None = None
        self._installed = False

    def __enter__(self) -> InterruptGuard:
        if threading.current_thread() is threading.main_thread():
            previous = signal.getsignal(signal.SIGINT)
            if callable(previous):  # default_int_handler, or IPython's: wrap it
                self._previous = previous
                signal.signal(signal.SIGINT, self._handle)
                self._installed = True
        return self

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.holding:
            self.held = True
            return
        assert self._previous is not None  # installed only with a previous handler
        self._previous(signum, frame)

    def hold(self) -> None:
        self.holding = True

    def release(self) -> None:
        """Stop holding; raise KeyboardInterrupt now if one arrived meanwhile."""
        self.holding = False
        if self.held:
            self.held = False
            raise KeyboardInterrupt

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> Literal[False]:
        if self._installed:
            signal.signal(signal.SIGINT, self._previous)
        if self.held and exc_type is None:
            raise KeyboardInterrupt
        return False


def stop_processes(procs: list[BaseProcess]) -> None:
    """Terminate (then kill) every rank still running, and any child processes they started."""
    alive = [p for p in procs if p.exitcode is None]
    if not alive:
        return
    descendants: list[psutil.Process] = []
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
    wait_all([p.sentinel for p in alive], STOP_GRACE_S)  # every rank gets the whole grace
    for p in alive:
        if p.exitcode is None:
            p.kill()  # SIGKILL: a rank stuck in C++ (a collective) may not act on SIGTERM
        p.join(timeout=5.0)
    _, still = psutil.wait_procs(descendants, timeout=STOP_GRACE_S)
    for d in still:
        try:
            d.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(still, timeout=STOP_GRACE_S)


def wait_all(sentinels: Iterable[int], timeout: float) -> None:
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
