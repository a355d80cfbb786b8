"""What one persistent rank runs: join the process group, then execute cells sent by the kernel.

Part of :mod:`course_lib.runtime.rankset` (the ``%%ranks`` magic of :mod:`course_lib.ranks`).
A rank is started like a :func:`course_lib.launch` rank (a fork of the warm forkserver, the
caller's environment and import path, one intra-op thread, a FileStore rendezvous in a private
directory, gloo or NCCL as ``device.resolve_backend`` chose), but instead of calling one
function and exiting it loops: receive a request on its pipe, run it in its own namespace
(which persists from cell to cell), reply. Requests and replies are cloudpickled bytes:

    ("exec", definitions, source, filename)  -> ("ok", last value's repr or None, notes)
    ("eval", definitions, expression)         -> ("ok", cloudpickled value, notes)
    ("push", cloudpickled {name: value})      -> ("ok", None, notes)
    any of them                               -> ("error", type, message, traceback, notes)

``definitions`` are (label, source) pairs of the kernel's own imports, functions and classes
(see ``_definitions.py``), run first; ``notes`` lists those that failed here, so that the
kernel can say once what the ranks lack. stdout/stderr (fds 1 and 2) go to this rank's files
in the set's directory; the kernel reads what each cell added. On the pipe every message is
8 bytes of request number (echoed in the reply, so a late reply is recognised) + the pickle.

Interrupts: SIGINT raises KeyboardInterrupt only while a request is running, and only once per
request (the kernel's process group and the kernel itself may both send one). Parent-death
watch: a thread blocks on the read end of a "lifeline" pipe whose only write end the kernel
holds; when the kernel exits, however it exits, the read ends and the rank kills itself.
"""

from __future__ import annotations

import ast
import faulthandler
import linecache
import os
import signal
import sys
import threading
import time
import traceback
from datetime import timedelta

import cloudpickle
import torch
import torch.distributed as dist

from course_lib.runtime import _worker


class _State:
    busy = False  # a request is running: SIGINT may interrupt it


def _on_sigint(signum, frame) -> None:
    if _State.busy:
        _State.busy = False  # one KeyboardInterrupt per request, however many SIGINTs arrive
        raise KeyboardInterrupt


def _watch_lifeline(lifeline) -> None:
    """Block until the kernel's end of the lifeline closes (the kernel exited); then die."""
    if hasattr(signal, "pthread_sigmask"):  # signals for the rank go to its main thread, not here
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM, signal.SIGUSR1})
    try:
        while True:
            lifeline.recv_bytes()
    except (EOFError, OSError):
        pass
    os.kill(os.getpid(), signal.SIGKILL)


def _register_source(source: str, filename: str) -> None:
    """Let tracebacks show the lines of a cell, as IPython does for its own cells."""
    lines = source.splitlines(keepends=True)
    linecache.cache[filename] = (len(source), None, lines, filename)


def _run_cell(source: str, filename: str, namespace: dict) -> str | None:
    """Execute ``source`` like a notebook cell; return the repr of its last expression's value."""
    _register_source(source, filename)
    tree = ast.parse(source, filename=filename)
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    exec(compile(tree, filename, "exec"), namespace)
    if last is None:
        return None
    value = eval(compile(last, filename, "eval"), namespace)
    if value is None:
        return None
    namespace["_"] = value
    return repr(value)


def _define(definitions: list, namespace: dict, failed: dict) -> list[str]:
    """Run the kernel's definitions here; return notes for those that fail (each once)."""
    notes = []
    for label, source, filename in definitions:
        try:
            _register_source(source, filename)
            exec(compile(source, filename, "exec"), namespace)
            failed.pop(label, None)
        except BaseException as exc:  # noqa: B036 - a definition never stops the cell
            if isinstance(exc, KeyboardInterrupt):
                raise
            note = f"{label}: {type(exc).__name__}: {exc}"
            if failed.get(label) != note:
                notes.append(note)
            failed[label] = note
    return notes


def _user_traceback(exc: BaseException) -> str:
    """The traceback without this module's own frames (the cell's lines are what matter)."""
    te = traceback.TracebackException.from_exception(exc)
    te.stack = traceback.StackSummary.from_list([f for f in te.stack if f.filename != __file__])
    return "".join(te.format())


def _handle(request: tuple, namespace: dict, failed: dict) -> tuple:
    kind = request[0]
    notes: list[str] = []
    try:
        _State.busy = True
        if kind == "exec":
            _, definitions, source, filename = request
            notes = _define(definitions, namespace, failed)
            return ("ok", _run_cell(source, filename, namespace), notes)
        if kind == "eval":
            notes = _define(request[1], namespace, failed)
            value = eval(compile(request[2], "<gather>", "eval"), namespace)
            _State.busy = False
            try:
                data = cloudpickle.dumps(value)
            except Exception as exc:
                raise TypeError(
                    f"the value of {request[2]!r} (type {type(value).__name__}) "
                    f"cannot be pickled, so it cannot be sent back: {exc}"
                ) from exc
            return ("ok", data, notes)
        if kind == "push":
            namespace.update(cloudpickle.loads(request[1]))
            return ("ok", None, notes)
        raise ValueError(f"unknown request {kind!r}")
    except BaseException as exc:  # noqa: B036 - KeyboardInterrupt/SystemExit fail the cell only
        _State.busy = False
        return ("error", type(exc).__name__, str(exc), _user_traceback(exc), notes)
    finally:
        _State.busy = False
        sys.stdout.flush()
        sys.stderr.flush()


def serve(rank: int, spec: dict, conn, lifeline) -> None:
    """Entry point of one persistent rank (the target of a forkserver Process)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # until the handler below is in place
    threading.Thread(target=_watch_lifeline, args=(lifeline,), daemon=True).start()
    workdir, world_size = spec["workdir"], spec["world_size"]
    _worker._redirect_std_streams(workdir, rank)
    os.environ.clear()
    os.environ.update(spec["env"])
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world_size),
        **{_worker.RANK_MARKER_ENV: "1"},
    )
    if spec.get("loopback_interface") and not os.environ.get("GLOO_SOCKET_IFNAME"):
        os.environ["GLOO_SOCKET_IFNAME"] = spec["loopback_interface"]
    sys.path[:] = spec["sys_path"]
    if spec.get("child_start_method"):
        import multiprocessing

        multiprocessing.set_start_method(spec["child_start_method"], force=True)
    torch.set_num_threads(spec["threads"])
    stack_file = open(_worker.rank_file(workdir, rank, "stack"), "w")
    if hasattr(signal, "SIGUSR1"):  # the kernel asks for this rank's stack at a cell's deadline
        faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=False)
    signal.signal(signal.SIGINT, _on_sigint)
    try:
        if spec["backend"] == "nccl":
            torch.cuda.set_device(rank)
        timeout = timedelta(seconds=spec["pg_timeout"])
        store = dist.FileStore(_worker.store_file(workdir), world_size)
        store.set_timeout(timeout)
        dist.init_process_group(
            spec["backend"], store=store, rank=rank, world_size=world_size, timeout=timeout
        )
        if world_size > 1:
            _worker._all_joined(store, world_size, spec["pg_timeout"])
        from course_lib.runtime.device import rank_device

        reply = ("ok", None, [], 0.0)
    except BaseException as exc:  # noqa: B036 - reported to the kernel as a failed start
        reply = ("error", type(exc).__name__, str(exc), traceback.format_exc(), [], 0.0)
    conn.send_bytes(bytes(8) + cloudpickle.dumps(reply))  # request number 0: the start
    if reply[0] != "ok":
        return
    namespace = {
        "__name__": "__main__",
        "__builtins__": __builtins__,
        "rank": rank,
        "world_size": world_size,
        "torch": torch,
        "dist": dist,
        "device": rank_device(),
    }
    failed: dict[str, str] = {}
    while True:
        try:
            data = conn.recv_bytes()
        except (EOFError, OSError):
            break  # the kernel closed the pipe: stop
        except KeyboardInterrupt:  # cannot happen while idle, but never leave the loop for it
            continue
        seq, request = data[:8], cloudpickle.loads(data[8:])
        if request[0] == "stop":
            break
        started = time.perf_counter()
        reply = _handle(request, namespace, failed)
        try:
            conn.send_bytes(seq + cloudpickle.dumps(reply + (time.perf_counter() - started,)))
        except (BrokenPipeError, OSError):
            break
    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:
            pass
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip interpreter teardown (atexit handlers of user code, CUDA teardown)
