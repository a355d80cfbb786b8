"""Keep the course's own answer out of a graded task.

Most tasks ask the learner to write something that ``course_lib`` already contains (the lecture
uses it). A check that only compares outputs would pass a learner who calls the course's version.
So a check names the references of its task, and while the learner's function runs each of them
is trapped (:mod:`course_lib.grading.traps`): if any path enters a reference's code (the function
itself, a subclass calling its methods, an alias bound before the check, a thread), the verdict is
``✗ task N: uses the course's own <name>: write it yourself``, whatever the output.

References are named as ``"module:qualname"`` strings (``"course_lib.techniques.optim:Adam"``), so
a check module need not import them; they are imported when the check runs. A class stands for
every function defined in its body. Used by ``run_learner(..., forbid=...)`` and, inside ranks,
by checks that run the learner's function under ``course_lib.launch``.
"""

from __future__ import annotations

import importlib
import os
import types
from contextlib import contextmanager
from typing import Any, Iterable, Iterator

__all__ = ["reference_codes", "reference_functions", "watch_references"]


def _resolve(spec: str) -> Any:
    if not isinstance(spec, str) or spec.count(":") != 1:
        raise ValueError(
            f"reference = {spec!r}: expected 'module:qualname', "
            "e.g. 'course_lib.techniques.optim:Adam'"
        )
    module_name, qualname = spec.split(":")
    obj: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ValueError(f"reference = {spec!r}: {module_name} has no {qualname}") from None
    return obj


def reference_codes(references: Iterable[str]) -> dict[types.CodeType, str]:
    """Map every code object of the named references (each function's own code and the nested
    functions and comprehensions it defines) to the reference's short name."""
    from course_lib.grading.traps import original_code

    codes: dict[types.CodeType, str] = {}
    for func, short in reference_functions(references):
        code = original_code(func)
        for c in (code, *(k for k in code.co_consts if isinstance(k, types.CodeType))):
            codes.setdefault(c, short)
    return codes


def _functions_of(
    obj: Any, home: str, _seen: set[int] | None = None
) -> Iterator[types.FunctionType]:
    """The Python functions that do the work of ``obj``, defined in the file ``home``."""
    if isinstance(obj, (staticmethod, classmethod)):
        obj = obj.__func__
    if isinstance(obj, property):
        for f in (obj.fget, obj.fset, obj.fdel):
            if f is not None:
                yield from _functions_of(f, home, _seen)
        return
    if isinstance(obj, type):
        # classes can refer to each other (a torch.autograd.Function and its generated
        # _backward_cls point at one another): visit each class once
        _seen = set() if _seen is None else _seen
        if id(obj) in _seen:
            return
        _seen.add(id(obj))
        for member in vars(obj).values():
            yield from _functions_of(member, home, _seen)
        return
    from course_lib.grading.traps import original_code

    while True:
        if isinstance(obj, types.FunctionType):
            if os.path.realpath(original_code(obj).co_filename) == home:
                yield obj
        wrapped = getattr(obj, "__wrapped__", None)
        if wrapped is None:
            return
        obj = wrapped


def reference_functions(references: Iterable[str]) -> list[tuple[types.FunctionType, str]]:
    """``(function, short name)`` for every function of the named references (see module doc)."""
    if isinstance(references, str):
        references = [references]
    found: list[tuple[types.FunctionType, str]] = []
    for spec in references:
        obj = _resolve(spec)
        short = spec.split(":")[1]
        # only code written in the reference's own module (where it is defined, which may not
        # be the module that re-exports it): a decorator's wrapper (functools, dataclasses'
        # __repr__, torch.optim's no-grad wrapper) is shared with everyone else
        module = getattr(obj, "__module__", None) or spec.split(":")[0]
        home = os.path.realpath(importlib.import_module(module).__file__ or "")
        functions = list(_functions_of(obj, home))
        if not functions:
            raise ValueError(
                f"reference = {spec!r}: {type(obj).__name__} has no Python code "
                "to watch (name a function or a class)"
            )
        found += [(f, short) for f in functions]
    return found


@contextmanager
def watch_references(references: Iterable[str]) -> Iterator[list[str]]:
    """Record, in the yielded list, each named reference entered while the block runs.

    The list holds short names (``"Adam"``) in the order first entered, each once, from any
    thread. The block is not interrupted (a learner's function that uses a reference still
    returns); the caller turns a non-empty list into a failure. The references are trapped
    (:mod:`course_lib.grading.traps`), so switching off a profiler or calling from a thread
    hides nothing.
    """
    from course_lib.grading.traps import watching

    with watching(reference_functions(references)) as used:
        yield used
