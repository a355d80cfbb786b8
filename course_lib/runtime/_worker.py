"""What one rank runs: the module-level trampoline that :func:`course_lib.launch` starts.

A notebook-defined ``fn`` cannot be imported by name in a fresh process, so the caller sends it
*by value* (cloudpickle) and this trampoline, which *can* be imported by name, unpacks and calls
it. The module is small and imports only torch, cloudpickle and the runtime's compat and device
modules, because the launcher preloads it into the forkserver: every rank is then a ``fork()`` of
a process that already imported torch.

Everything a rank produces goes to files in the launch's private temporary directory:
``rank{r}.out`` / ``rank{r}.err`` (file descriptors 1 and 2, so C++ warnings are captured too),
``rank{r}.result`` (the pickled return value or exception, written atomically) and
``rank{r}.stack`` (a faulthandler dump of every thread if the rank is still running at the
deadline). Files, not pipes: a rank can never block on a full pipe, and the output of a rank
killed by a signal is still there to show. The ranks meet through ``store`` there, a FileStore.
"""

from __future__ import annotations

import os
import signal
from types import FrameType

# Set (briefly) by the caller while it starts the forkserver, which preloads this module first.
FORKSERVER_PRELOAD_ENV = "COURSE_LIB_FORKSERVER_PRELOAD"


def _exit_quietly(signum: int, frame: FrameType | None) -> None:
    """The forkserver's SIGINT handler while it imports torch (seconds, on the first launch).

    "Interrupt kernel" signals the kernel's whole process group, the forkserver included;
    without this it died printing ~30 lines of its own KeyboardInterrupt traceback into the
    cell. It exits as before, only quietly; the next launch starts a new one. Installed before
    any other import, so that even a loaded machine leaves no window without it.
    """
    os._exit(128 + signum)


if os.environ.pop(FORKSERVER_PRELOAD_ENV, None):  # in the forkserver, before the slow imports
    signal.signal(signal.SIGINT, _exit_quietly)
    if hasattr(signal, "pthread_sigmask"):  # started with SIGINT blocked (processes.start_method)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})

import faulthandler  # noqa: E402
import importlib  # noqa: E402
import multiprocessing  # noqa: E402
import multiprocessing.process  # noqa: E402
import multiprocessing.spawn  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from datetime import timedelta  # noqa: E402

# Set in every rank so a nested launch() can refuse clearly instead of forking a second world.
RANK_MARKER_ENV = "COURSE_LIB_LAUNCH_RANK"
# Set (briefly) by the caller while it starts the forkserver: "path:<file>" or "name:<module>".
FORKSERVER_MAIN_ENV = "COURSE_LIB_FORKSERVER_MAIN"

import cloudpickle  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from course_lib.runtime import compat  # noqa: E402
from course_lib.runtime.device import group_backend  # noqa: E402
from course_lib.runtime.protocol import RankResult, RankSpec  # noqa: E402

# The folder that holds course_lib/: tracebacks name the course's files from the package
# ("course_lib/runtime/_worker.py"), so what a cell prints does not depend on where it was cloned.
_PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _traceback() -> str:
    return traceback.format_exc().replace(_PACKAGE_PARENT + os.sep, "")


def _import_caller_main(main: str) -> None:
    """In the forkserver: import the caller's main module once, as ``__mp_main__``.

    multiprocessing re-imports the parent's ``__main__`` in every child it starts (so that
    objects defined there can be unpickled). The stdlib forkserver means to do that once, in the
    server (its default preload is "__main__"), but in Python 3.11 the main path never reaches
    the server, so every rank re-ran e.g. the pytest script (~0.4 s per launch). Doing it here,
    with the stdlib's own helpers, makes each forked rank find its main already in place.
    """
    kind, _, target = main.partition(":")
    current = multiprocessing.process.current_process()
    # what forkserver.main sets around the same import (private: not in typeshed)
    setattr(current, "_inheriting", True)  # noqa: B010
    try:
        if kind == "path":
            multiprocessing.spawn.import_main_path(target)
        elif kind == "name":
            getattr(multiprocessing.spawn, "_fixup_main_from_name")(target)  # noqa: B009 - private
    except BaseException:  # noqa: B036 - a main that cannot be imported here: ranks do it themselves
        pass
    finally:
        delattr(current, "_inheriting")


if FORKSERVER_MAIN_ENV in os.environ:  # only true while being preloaded into the forkserver
    _import_caller_main(os.environ.pop(FORKSERVER_MAIN_ENV))


def rank_file(workdir: str, rank: int, kind: str) -> str:
    """Path of one of the per-rank files ('out', 'err', 'result', 'stack')."""
    return os.path.join(workdir, f"rank{rank}.{kind}")


def store_file(workdir: str) -> str:
    """Path of the FileStore through which the ranks of one launch meet."""
    return os.path.join(workdir, "store")


def _redirect_std_streams(workdir: str, rank: int) -> None:
    """Point fd 1 and 2 (and sys.stdout/sys.stderr) at this rank's capture files."""
    for fd, kind in ((1, "out"), (2, "err")):
        with open(rank_file(workdir, rank, kind), "wb") as f:
            os.dup2(f.fileno(), fd)
    # line buffering keeps print() and warnings in the order they happened within a stream
    sys.stdout = open(
        1, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False
    )
    sys.stderr = open(
        2, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False
    )


def _write_result(workdir: str, rank: int, record: RankResult) -> None:
    path = rank_file(workdir, rank, "result")
    try:
        data = cloudpickle.dumps(record)
    except Exception as exc:  # the return value itself cannot travel back
        value_type = type(record.value).__name__ if record.kind == "ok" else "exception"
        record = RankResult(
            "error",
            time.time(),
            exc_type="TypeError",
            message=f"the return value of type {value_type} cannot be pickled: {exc!r}",
            traceback=_traceback(),
        )
        data = cloudpickle.dumps(record)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)  # atomic: the caller never reads half a result


def _all_joined(store: dist.Store, world_size: int, timeout: float) -> None:
    """Wait until every rank has finished ``init_process_group``.

    gloo connects the ranks pairwise; one rank can be through while a peer is still shaking
    hands with it. Without this wait a function that raises at once exits that rank, closes
    its sockets, and the peer reports "connectFullMesh failed" instead of its own error.
    The wait is in the store, never a collective, so it cannot mix with the user's own.
    """
    if store.add("course_lib/joined", 1) == world_size:
        store.set("course_lib/all_joined", "1")
    store.wait(["course_lib/all_joined"], timedelta(seconds=timeout))


def _finish(store: dist.Store, world_size: int, timeout: float, wait: bool) -> None:
    """Count this rank as finished; if ``wait``, stay alive until every rank has finished.

    A rank that returns early and exits closes its gloo/NCCL connections, which breaks a peer
    still finishing ``init_process_group`` or a collective with it; so a rank that returned
    waits here (in the store, never in a collective, so it cannot mismatch the user's own
    collectives). A rank that raised does not wait: its exit is what tells peers stuck in a
    collective with it to give up now rather than at the timeout.
    """
    if store.add("course_lib/finished", 1) == world_size:
        store.set("course_lib/all_finished", "1")
    if wait:
        store.wait(["course_lib/all_finished"], timedelta(seconds=timeout))


def prepare_rank(rank: int, spec: RankSpec) -> None:
    """Make this process rank ``rank`` of ``spec``: the caller's environment (the forkserver
    froze its own when it started) with the variables torchrun sets, the caller's import path,
    the start method of its own children, and its intra-op threads."""
    os.environ.clear()
    os.environ.update(spec.env)
    # the same variables torchrun sets, so env-reading code runs unchanged under both
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(spec.world_size),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(spec.world_size),
        **{RANK_MARKER_ENV: "1"},
    )
    if spec.loopback_interface and not os.environ.get("GLOO_SOCKET_IFNAME"):
        # all ranks are on this machine: gloo need not resolve the host name to find an address
        os.environ["GLOO_SOCKET_IFNAME"] = spec.loopback_interface
    # The caller's import path as it is now (multiprocessing maps '' to where it started).
    sys.path[:] = spec.sys_path
    importlib.invalidate_caches()
    if spec.child_start_method:
        # DataLoader workers and other children: fork, so notebook-defined classes need no pickle
        multiprocessing.set_start_method(spec.child_start_method, force=True)
    torch.set_num_threads(spec.threads)  # N ranks x 1 thread: no oversubscribed cores


def open_store(spec: RankSpec) -> dist.FileStore:
    """The FileStore through which the ranks of ``spec`` meet (see :func:`join_group`)."""
    store = dist.FileStore(store_file(spec.workdir), spec.world_size)
    store.set_timeout(timedelta(seconds=spec.timeout))
    return store


def join_group(rank: int, spec: RankSpec, store: dist.FileStore) -> None:
    """Join the process group of ``spec`` through ``store``; wait until every rank has.

    The ranks meet through a file in the private directory, so two launches (two notebooks)
    never collide, and no name service is asked anything: a TCPStore reverse-resolves
    ::ffff:127.0.0.1 on every connection, and a lost DNS query stalled the launch for glibc's
    5 s retry time-out. gloo/NCCL pick free ports themselves.
    """
    compat.provide_new_collective_names()
    if spec.backend == "nccl":
        torch.cuda.set_device(rank)  # one GPU per rank, never two ranks on one GPU
    timeout = timedelta(seconds=spec.timeout)
    dist.init_process_group(
        group_backend(spec.backend),
        store=store,
        rank=rank,
        world_size=spec.world_size,
        timeout=timeout,
    )
    if spec.world_size > 1:
        _all_joined(store, spec.world_size, spec.timeout)


def _call(rank: int, spec: RankSpec) -> tuple[bool, dist.FileStore | None]:
    """Join the group, call fn, write the result record; (whether fn returned, the store)."""
    store = None
    try:
        store = open_store(spec)
        join_group(rank, spec, store)
        fn, args, kwargs = cloudpickle.loads(spec.payload)
        value = fn(rank, spec.world_size, *args, **kwargs)
        _write_result(spec.workdir, rank, RankResult("ok", time.time(), value=value))
        return True, store
    except BaseException as exc:  # noqa: B036 - SystemExit/KeyboardInterrupt are failures too
        record = RankResult(
            "error",
            time.time(),
            exc_type=type(exc).__name__,
            message=str(exc),
            traceback=_traceback(),
        )
        _write_result(spec.workdir, rank, record)
        return False, store


def run_rank(rank: int, spec: RankSpec) -> None:
    """Entry point of one rank (called by torch.multiprocessing as ``run_rank(rank, spec)``)."""
    signal.signal(signal.SIGINT, signal.default_int_handler)  # not the forkserver's quiet exit
    try:
        _redirect_std_streams(spec.workdir, rank)
    except OSError:  # the directory is gone: the caller gave up on this launch while starting it
        return
    prepare_rank(rank, spec)
    stack_file = open(rank_file(spec.workdir, rank, "stack"), "w")
    # if this rank hangs, the caller gets its Python stack instead of just "timed out"
    faulthandler.dump_traceback_later(spec.timeout, exit=False, file=stack_file)
    ok, store = _call(rank, spec)
    try:
        if store is not None and spec.world_size > 1:
            _finish(store, spec.world_size, spec.timeout, wait=ok)
    except BaseException:  # noqa: B036 - the result is written; the caller decides what happened
        pass
    finally:
        faulthandler.cancel_dump_traceback_later()
        stack_file.close()
        # After a failure a peer may still wait in a collective; the caller stops it. Tearing
        # the group down here could block, so only a rank that succeeded does it.
        if ok and dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:
                traceback.print_exc()  # lands in this rank's captured stderr
        sys.stdout.flush()
        sys.stderr.flush()
