"""Keep the course's own answer out of a graded task.

Most tasks ask the learner to write something that ``course_lib`` already contains (the lecture
uses it). A check that only compares outputs would pass a learner who calls the course's version.
So a check names the references of its task, and while the learner's function runs the
interpreter's profile hook watches every Python call: if one of them enters a reference's code
(the function itself, a subclass calling its methods, an alias bound before the check), the
verdict is ``✗ task N: uses the course's own <name>: write it yourself``, whatever the output.

References are named as ``"module:qualname"`` strings (``"course_lib.techniques.optim:Adam"``), so
a check module need not import them; they are imported when the check runs. A class stands for
every function defined in its body. Used by ``run_learner(..., forbid=...)`` and, inside ranks,
by checks that run the learner's function under ``course_lib.launch``.

Introduced with the graded exercises (see CONTRIBUTING, "Notebooks").
"""

from __future__ import annotations

import importlib
import os
import sys
import types
from contextlib import contextmanager
from typing import Any, Iterable, Iterator

__all__ = ["reference_codes", "watch_references"]


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


def _codes_of(obj: Any, _seen: set[int] | None = None) -> Iterator[types.CodeType]:
    if isinstance(obj, (staticmethod, classmethod)):
        obj = obj.__func__
    if isinstance(obj, property):
        for f in (obj.fget, obj.fset, obj.fdel):
            if f is not None:
                yield from _codes_of(f, _seen)
        return
    if isinstance(obj, type):
        # classes can refer to each other (a torch.autograd.Function and its generated
        # _backward_cls point at one another): visit each class once
        _seen = set() if _seen is None else _seen
        if id(obj) in _seen:
            return
        _seen.add(id(obj))
        for member in vars(obj).values():
            yield from _codes_of(member, _seen)
        return
    while hasattr(obj, "__wrapped__"):  # functools.wraps: the code that does the work
        code = getattr(obj, "__code__", None)
        if code is not None:
            yield code
        obj = obj.__wrapped__
    code = getattr(obj, "__code__", None)
    if isinstance(code, types.CodeType):
        yield code
        for const in code.co_consts:  # nested functions and comprehensions it defines
            if isinstance(const, types.CodeType):
                yield const


def reference_codes(references: Iterable[str]) -> dict[types.CodeType, str]:
    """Map every code object of the named references to the reference's short name."""
    if isinstance(references, str):
        references = [references]
    codes: dict[types.CodeType, str] = {}
    for spec in references:
        obj = _resolve(spec)
        short = spec.split(":")[1]
        # only code written in the reference's own module (where it is defined, which may not
        # be the module that re-exports it): a decorator's wrapper (functools, dataclasses'
        # __repr__, torch.optim's no-grad wrapper) is shared with everyone else
        module = getattr(obj, "__module__", None) or spec.split(":")[0]
        home = os.path.realpath(importlib.import_module(module).__file__ or "")
        found = [code for code in _codes_of(obj) if os.path.realpath(code.co_filename) == home]
        if not found:
            raise ValueError(
                f"reference = {spec!r}: {type(obj).__name__} has no Python code "
                "to watch (name a function or a class)"
            )
        for code in found:
            codes.setdefault(code, short)
    return codes


@contextmanager
def watch_references(references: Iterable[str]) -> Iterator[list[str]]:
    """Record, in the yielded list, each named reference entered while the block runs.

    The list holds short names (``"Adam"``) in the order first entered, each once. The block is
    not interrupted (a learner's function that uses a reference still returns); the caller turns
    a non-empty list into a failure. Any profiler already installed (a debugger, coverage) keeps
    receiving its events.
    """
    codes = reference_codes(references)
    # by identity: code objects compare equal by value, so a copy compiled from the same text
    # would otherwise count as the course's own (the dict above keeps the objects alive)
    names = {id(code): name for code, name in codes.items()}
    used: list[str] = []
    previous = sys.getprofile()

    def hook(frame, event, arg):
        if event == "call":
            name = names.get(id(frame.f_code))
            if name is not None and name not in used:
                used.append(name)
        if previous is not None:
            previous(frame, event, arg)

    sys.setprofile(hook)
    try:
        yield used
    finally:
        sys.setprofile(previous)
