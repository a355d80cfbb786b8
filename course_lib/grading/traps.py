"""Traps: the course's own answers swapped for a stand-in that records who calls them.

While a graded learner function runs, each function of the task's references (a function, or
every function defined in a reference class's body) has its code replaced by a trampoline that
notes the call in every active watch and then runs the original code, so the learner's function
returns as it would. The code object is swapped in place (``func.__code__``), so every path to
the function goes through the trap: the name, an alias bound before the check, a subclass, a
default argument, a thread started by the learner. Nothing depends on a profiler a learner can
switch off (``sys.setprofile(None)``).

In a learner's own kernel (the self-check), the original code is put back when the last watch
ends, so ``inspect`` and signatures of the course's functions work as before between checks. In
the grade command's clean process (:mod:`course_lib.grading.isolate`) the traps are installed
before any learner code runs and stay (:func:`keep_installed`), so code captured at definition
time is trapped too.
"""

from __future__ import annotations

import threading
import types
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterable, Iterator

__all__ = ["installed_traps", "keep_installed", "original_code", "trap_functions", "watching"]

_DISPATCH_NAME = "__course_trap__"


@dataclass
class _Trap:
    func: types.FunctionType
    original: types.CodeType
    trampoline: types.CodeType
    name: str  # the reference's short name, as verdicts print it


_TRAPS: dict[int, _Trap] = {}  # id(func) -> its trap
_ACTIVE: list[tuple[frozenset[int], list[str]]] = []  # (trapped function ids, used names)
_LOCK = threading.RLock()
_KEEP = False


def _dispatch(key: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    trap = _TRAPS[key]
    with _LOCK:
        for ids, used in _ACTIVE:
            if key in ids and trap.name not in used:
                used.append(trap.name)
    f = trap.func
    original = types.FunctionType(
        trap.original, f.__globals__, f.__name__, f.__defaults__, f.__closure__
    )
    original.__kwdefaults__ = f.__kwdefaults__
    return original(*args, **kwargs)


def _trampoline(func: types.FunctionType, key: int) -> types.CodeType:
    """A code object with the function's free-variable count that calls :func:`_dispatch`."""
    cells = [f"_cell{i}" for i in range(len(func.__code__.co_freevars))]
    lines = ["def _outer():"]
    lines += [f"    {c} = None" for c in cells]
    lines.append("    def trap(*args, **kwargs):")
    if cells:
        lines.append(f"        ({', '.join(cells)},)")
    lines.append(f"        return {_DISPATCH_NAME}({key}, args, kwargs)")
    lines.append("    return trap")
    module = compile("\n".join(lines), f"<trap of {func.__qualname__}>", "exec")
    outer = next(c for c in module.co_consts if isinstance(c, types.CodeType))
    inner = next(c for c in outer.co_consts if isinstance(c, types.CodeType))
    return inner.replace(co_name=func.__code__.co_name, co_qualname=func.__qualname__)


def _install(func: types.FunctionType, name: str) -> int:
    key = id(func)
    if key not in _TRAPS:
        trap = _Trap(func, func.__code__, _trampoline(func, key), name)
        func.__globals__[_DISPATCH_NAME] = _dispatch
        func.__code__ = trap.trampoline
        _TRAPS[key] = trap
    return key


def _restore_all() -> None:
    for trap in _TRAPS.values():
        trap.func.__code__ = trap.original
    _TRAPS.clear()


def original_code(func: types.FunctionType) -> types.CodeType:
    """The function's own code, also while a trap holds its place."""
    trap = _TRAPS.get(id(func))
    return trap.original if trap is not None and trap.func is func else func.__code__


def installed_traps() -> dict[types.FunctionType, types.CodeType]:
    """Every trapped function and the trampoline it should hold (for the integrity check)."""
    with _LOCK:
        return {t.func: t.trampoline for t in _TRAPS.values()}


def trap_functions(functions: Iterable[tuple[types.FunctionType, str]]) -> frozenset[int]:
    """Install a trap in each ``(function, short name)``; the keys of their traps."""
    with _LOCK:
        return frozenset(_install(f, name) for f, name in functions)


def keep_installed() -> None:
    """From now on traps stay installed when their watch ends (the grade's clean process)."""
    global _KEEP
    _KEEP = True


@contextmanager
def watching(functions: Iterable[tuple[types.FunctionType, str]]) -> Iterator[list[str]]:
    """Yield a list that collects the short names of the trapped functions called, from any
    thread, while the block runs."""
    used: list[str] = []
    with _LOCK:
        entry = (trap_functions(functions), used)
        _ACTIVE.append(entry)
    try:
        yield used
    finally:
        with _LOCK:
            _ACTIVE.remove(entry)
            if not _ACTIVE and not _KEEP:
                _restore_all()
