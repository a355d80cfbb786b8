"""What one persistent rank runs: join the process group, then execute cells sent by the kernel.

Part of :mod:`course_lib.runtime.rankset` (the ``%%ranks`` magic of :mod:`course_lib.ranks`).
A rank is started like a :func:`course_lib.launch` rank (a fork of the warm forkserver, the
caller's environment and import path, one intra-op thread, a FileStore rendezvous in a private
directory, gloo or NCCL as ``device.resolve_backend`` chose), but instead of calling one
function and exiting it loops: receive a request on its pipe, run it in its own namespace
(which persists from cell to cell), reply. Requests and replies are cloudpickled bytes:

    Request("exec", source, filename, definitions) -> CellReply("ok", last value's repr or None)
    Request("eval", expression, definitions=...)   -> CellReply("ok", cloudpickled value)
    Request("push", values=cloudpickled {name: value}) -> CellReply("ok")
    any of them                                    -> CellReply("error", exc_type=..., ...)

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
from dataclasses import replace
from multiprocessing.connection import Connection
from types import FrameType
from typing import Any

import cloudpickle
import torch
import torch.distributed as dist

from course_lib.runtime import _worker
from course_lib.runtime.protocol import RANK_NAMES, CellReply, Definition, RankSpec, Request


class _State:
    busy = False  # a request is running: SIGINT may interrupt it


def _on_sigint(signum: int, frame: FrameType | None) -> None:
    if _State.busy:
        _State.busy = False  # one KeyboardInterrupt per request, however many SIGINTs arrive
        raise KeyboardInterrupt


def _watch_lifeline(lifeline: Connection) -> None:
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


def _run_cell(source: str, filename: str, namespace: dict[str, Any]) -> str | None:
    """Execute ``source`` like a notebook cell; return the repr of its last expression's value."""
    _register_source(source, filename)
    tree = ast.parse(source, filename=filename)
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body[-1].value)
        tree.body.pop()
    exec(compile(tree, filename, "exec"), namespace)
    if last is None:
        return None
    value = eval(compile(last, filename, "eval"), namespace)
    if value is None:
        return None
    namespace["_"] = value
    return repr(value)


def _define(
    definitions: tuple[Definition, ...], namespace: dict[str, Any], failed: dict[str, str]
) -> list[str]:
    """Run the kernel's definitions here; return notes for those that fail (each once)."""
    notes = []
    own = {n: namespace[n] for n in RANK_NAMES if n in namespace}  # as the rank's cells left them
    for label, source, filename in definitions:
        try:
            _register_source(source, filename)
            exec(compile(source, filename, "exec"), namespace)
            note = _keep_own(namespace, own, label, source)
            if note is None:
                failed.pop(label, None)
        except BaseException as exc:  # noqa: B036 - a definition never stops the cell
            if isinstance(exc, KeyboardInterrupt):
                raise
            note = f"{label}: {type(exc).__name__}: {exc}"
        if note is not None:
            if failed.get(label) != note:
                notes.append(note)
            failed[label] = note
    return notes


def _keep_own(
    namespace: dict[str, Any], own: dict[str, Any], label: str, source: str
) -> str | None:
    """Put back any rank-defined name (``rank``, ``world_size``, ...) a kernel definition replaced
    or assigned (``rank = 0`` on rank 0 too); a note saying so, or None. (``import torch`` binds
    the same module: nothing to put back.)"""
    assigned: set[str] = set()
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            assigned.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            assigned |= {t.id for t in targets if isinstance(t, ast.Name)}
    replaced = [
        name
        for name, value in own.items()
        if namespace.get(name, own) is not value or name in assigned
    ]
    for name in replaced:
        namespace[name] = own[name]
    if not replaced:
        return None
    name = replaced[0]
    return (
        f"{label}: refused, `{name}` is {RANK_NAMES[name]} in each rank and a notebook "
        "value never replaces it (give the notebook's variable another name)"
    )


def _user_traceback(exc: BaseException) -> str:
    """The traceback without this module's own frames (the cell's lines are what matter)."""
    te = traceback.TracebackException.from_exception(exc)
    te.stack = traceback.StackSummary.from_list([f for f in te.stack if f.filename != __file__])
    return "".join(te.format())


class UnpicklableError(TypeError):
    """A gathered value that cannot be pickled (the kernel shows its message alone, one line)."""


def _evaluate(request: Request, namespace: dict[str, Any]) -> bytes:
    value = eval(compile(request.source, "<gather>", "eval"), namespace)
    _State.busy = False
    try:
        return bytes(cloudpickle.dumps(value))
    except Exception as exc:
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise UnpicklableError(
            f"expression = {request.source!r}: expected a value that can be pickled to send "
            f"back to the kernel; its value, a {type(value).__name__}, cannot be ({why})"
        ) from None


def _handle(request: Request, namespace: dict[str, Any], failed: dict[str, str]) -> CellReply:
    notes: list[str] = []
    try:
        _State.busy = True
        if request.kind == "exec":
            notes = _define(request.definitions, namespace, failed)
            value = _run_cell(request.source, request.filename, namespace)
            return CellReply("ok", value, notes)
        if request.kind == "eval":
            notes = _define(request.definitions, namespace, failed)
            return CellReply("ok", _evaluate(request, namespace), notes)
        if request.kind == "push":
            namespace.update(cloudpickle.loads(request.values))
            return CellReply("ok", None, notes)
        raise ValueError(f"unknown request {request.kind!r}")
    except BaseException as exc:  # noqa: B036 - KeyboardInterrupt/SystemExit fail the cell only
        _State.busy = False
        return CellReply(
            "error",
            notes=notes,
            exc_type=type(exc).__name__,
            message=str(exc),
            traceback="" if isinstance(exc, UnpicklableError) else _user_traceback(exc),
        )
    finally:
        _State.busy = False
        sys.stdout.flush()
        sys.stderr.flush()


def _start(rank: int, spec: RankSpec) -> CellReply:
    """Join the process group; the reply to request number 0 (the start)."""
    try:
        _worker.join_group(rank, spec, _worker.open_store(spec))
        return CellReply("ok")
    except BaseException as exc:  # noqa: B036 - reported to the kernel as a failed start
        return CellReply(
            "error",
            exc_type=type(exc).__name__,
            message=str(exc),
            traceback=traceback.format_exc(),
        )


def _loop(conn: Connection, namespace: dict[str, Any]) -> None:
    """Answer requests until the kernel says stop or closes the pipe."""
    failed: dict[str, str] = {}
    while True:
        try:
            data = conn.recv_bytes()
        except (EOFError, OSError):
            break  # the kernel closed the pipe: stop
        except KeyboardInterrupt:  # cannot happen while idle, but never leave the loop for it
            continue
        seq, request = data[:8], cloudpickle.loads(data[8:])
        if request.kind == "stop":
            break
        started = time.perf_counter()
        reply = replace(_handle(request, namespace, failed), seconds=time.perf_counter() - started)
        try:
            conn.send_bytes(seq + cloudpickle.dumps(reply))
        except (BrokenPipeError, OSError):
            break


def serve(rank: int, spec: RankSpec, conn: Connection, lifeline: Connection) -> None:
    """Entry point of one persistent rank (the target of a forkserver Process)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # until the handler below is in place
    threading.Thread(target=_watch_lifeline, args=(lifeline,), daemon=True).start()
    _worker._redirect_std_streams(spec.workdir, rank)
    _worker.prepare_rank(rank, spec)
    stack_file = open(_worker.rank_file(spec.workdir, rank, "stack"), "w")
    if hasattr(signal, "SIGUSR1"):  # the kernel asks for this rank's stack at a cell's deadline
        faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=False)
    signal.signal(signal.SIGINT, _on_sigint)
    reply = _start(rank, spec)
    conn.send_bytes(bytes(8) + cloudpickle.dumps(reply))  # request number 0: the start
    if reply.kind != "ok":
        return
    from course_lib.runtime.device import rank_device

    namespace = {
        "__name__": "__main__",
        "__builtins__": __builtins__,
        "rank": rank,
        "world_size": spec.world_size,
        "torch": torch,
        "dist": dist,
        "device": rank_device(),
    }
    _loop(conn, namespace)
    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:
            pass
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip interpreter teardown (atexit handlers of user code, CUDA teardown)
