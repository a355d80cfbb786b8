"""The course's answers to a unit's tasks, made absent from the sandbox that grades the unit.

Every checks module of a unit names the course's own answers to its tasks as ``"module:qualname"``
strings (the forbid lists of :func:`course_lib.grading.core.run_learner`). For the grade's sandbox
(:mod:`course_lib.grading.sandbox`) this module writes, for each file that defines one of them, a
copy in which the body of each such function (and of every function in the body of each such
class) is one ``raise RuntimeError("... is absent while unit NN is graded ...")``; the sandbox
mounts the copy over the original file and an empty file over the original's compiled
``__pycache__`` entries, so neither the source nor its bytecode can be read or imported there,
whatever the learner does to Python. The building blocks a task may use are untouched.

    stubs = absent_files("course_lib.units.u00_start_here", folder)   # [(stub copy, original)]
    hidden = compiled_copies(original)                                  # its .pyc files
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import importlib.machinery
import importlib.util
import inspect
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = ["KEEP_NAME", "absent_files", "compiled_copies", "stub_source", "unit_references"]

#: a checks module's tuple of references that stay in the sandbox: a building block the
#: notebook's own given code needs (unit 04's given master-weights class runs torch.optim.Adam),
#: which the task that forbids it keeps out by its trap alone
KEEP_NAME = "KEEP_IN_SANDBOX"


def _references_in(value: Any, out: list[str]) -> None:
    items = [value] if isinstance(value, str) else value
    if isinstance(items, (list, tuple, set, frozenset)):
        for item in items:
            if isinstance(item, str) and _looks_like_reference(item):
                out.append(item)
            elif isinstance(item, (list, tuple)):
                _references_in(item, out)


def _looks_like_reference(text: str) -> bool:
    module, sep, qualname = text.partition(":")
    return (
        bool(sep)
        and module.replace(".", "").replace("_", "").isalnum()
        and all(part.isidentifier() for part in qualname.split("."))
    )


def unit_references(unit: str) -> list[str]:
    """Every ``"module:qualname"`` named in the unit package's ``checks*.py`` modules, but those
    a module keeps (:data:`KEEP_NAME`)."""
    spec = importlib.util.find_spec(unit)
    if spec is None or not spec.origin:
        return []
    found: list[str] = []
    keep: list[str] = []
    for path in sorted(Path(spec.origin).parent.glob("checks*.py")):
        module = importlib.import_module(f"{unit}.{path.stem}")
        for name, value in vars(module).items():
            _references_in(value, keep if name == KEEP_NAME else found)
    return sorted(set(found) - set(keep))


def _source_of(module_name: str) -> str | None:
    """The ``.py`` file of ``module_name``, found without importing it or its parent packages
    (``importlib.util.find_spec("a.b.c")`` imports ``a.b``: for a package whose ``__init__``
    imports torch, seconds of CPU before the sandbox starts): the top-level package is found as
    Python finds it (an editable install's finder included), each submodule in its parent's
    search path."""
    parts = module_name.split(".")
    try:
        found = (
            sys.modules[parts[0]].__spec__
            if parts[0] in sys.modules
            else importlib.util.find_spec(parts[0])
        )
        for depth in range(1, len(parts)):
            locations = found.submodule_search_locations if found is not None else None
            if not locations:
                return None
            found = importlib.machinery.PathFinder.find_spec(
                ".".join(parts[: depth + 1]), list(locations)
            )
    except (ImportError, ValueError, AttributeError):
        return None
    if found is None or not found.origin or not found.origin.endswith(".py"):
        return None
    return found.origin


def _defined_in_file(spec: str) -> tuple[Path, str] | None:
    """(the module's file, the qualname) when the module named by ``spec`` defines it in its own
    source: found without running the module (importing a unit's references would import
    torch before the sandbox starts); None otherwise."""
    module_name, _, qualname = spec.partition(":")
    origin = _source_of(module_name)
    if origin is None:
        return None
    path = Path(os.path.realpath(origin))
    try:
        body: list[ast.stmt] = ast.parse(path.read_text(), str(path)).body
    except (OSError, SyntaxError):
        return None
    for part in qualname.split("."):
        node = next(
            (
                n
                for n in body
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                and n.name == part
            ),
            None,
        )
        if node is None:
            return None
        body = node.body
    return path, qualname


def _defined_at(spec: str) -> tuple[Path, str] | None:
    """(the file that defines the reference, its qualname there), or None when it has no
    Python source of its own."""
    static = _defined_in_file(spec)
    if static is not None:
        return static
    module_name, _, qualname = spec.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError):
        return None
    target = inspect.unwrap(obj) if callable(obj) and not isinstance(obj, type) else obj
    try:
        source = inspect.getsourcefile(target)
    except TypeError:
        return None
    name = getattr(target, "__qualname__", None)
    if not source or not isinstance(name, str) or "<locals>" in name:
        return None
    return Path(os.path.realpath(source)), name


class _Stubber(ast.NodeTransformer):
    def __init__(self, targets: dict[str, str]):
        self.targets = targets
        self.scope: list[str] = []
        self.done: set[str] = set()

    def _message(self, spec: str) -> ast.stmt:
        text = (
            f"{spec} is the course's own answer to a task of the unit being graded: it is "
            "absent while the unit is graded (write it yourself)"
        )
        return ast.Raise(
            exc=ast.Call(ast.Name("RuntimeError", ast.Load()), [ast.Constant(text)], []),
            cause=None,
        )

    def _visit_def(self, node: Any, is_class: bool) -> Any:
        qualname = ".".join([*self.scope, node.name])
        spec = self.targets.get(qualname)
        inside = next((s for q, s in self.targets.items() if qualname.startswith(q + ".")), None)
        if spec is not None:
            self.done.add(qualname)
        if not is_class and (spec or inside):
            node.body = [self._message(spec or inside or qualname)]
            return node
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()
        return node

    def visit_FunctionDef(self, node: ast.FunctionDef) -> Any:
        return self._visit_def(node, False)

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> Any:
        return self._visit_def(node, False)

    def visit_ClassDef(self, node: ast.ClassDef) -> Any:
        return self._visit_def(node, True)


def stub_source(source: str, targets: dict[str, str], filename: str = "<source>") -> str:
    """``source`` with the bodies of the ``targets`` (qualname -> the reference's name) replaced
    by a ``raise``; a class target stands for every function in its body."""
    tree = ast.parse(source, filename)
    stubber = _Stubber(targets)
    tree = ast.fix_missing_locations(stubber.visit(tree))
    missing = set(targets) - stubber.done
    if missing:
        raise ValueError(
            f"targets = {sorted(missing)}: expected definitions in {filename} to make absent"
        )
    return ast.unparse(tree) + "\n"


_CACHE: dict[
    tuple[str, tuple[str, ...]], tuple[list[tuple[Path, Path]], list[tuple[str, int, int]]]
] = {}


def _stat(path: Path) -> tuple[str, int, int]:
    stat = path.stat()
    return (str(path), stat.st_size, stat.st_mtime_ns)


def absent_files(unit: str, folder: Path, extra: Iterable[str] = ()) -> list[tuple[Path, Path]]:
    """A stubbed copy of every file that defines one of ``unit``'s references (and of
    ``extra``); ``[(stub copy, original file)]``. Written into ``folder`` the first time; a
    process that grades the unit again (a batch worker) reuses them while the originals are
    unchanged."""
    key = (unit, tuple(extra))
    cached = _CACHE.get(key)
    if cached is not None and all(c.is_file() for c, _ in cached[0]):
        with contextlib.suppress(OSError):
            if [_stat(o) for _, o in cached[0]] == cached[1]:
                return cached[0]
    found = _absent_files(unit, folder, extra)
    _CACHE[key] = (found, [_stat(o) for _, o in found])
    return found


def _absent_files(unit: str, folder: Path, extra: Iterable[str]) -> list[tuple[Path, Path]]:
    by_file: dict[Path, dict[str, str]] = {}
    for spec in [*unit_references(unit), *extra]:
        where = _defined_at(spec)
        if where is not None:
            by_file.setdefault(where[0], {})[where[1]] = spec
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for index, (original, targets) in enumerate(sorted(by_file.items())):
        copy = folder / f"{index:03d}_{original.name}"
        copy.write_text(stub_source(original.read_text(), targets, str(original)))
        out.append((copy, original))
    return out


def compiled_copies(original: Path) -> list[Path]:
    """The compiled bytecode files Python keeps for ``original`` (``__pycache__/stem.*.pyc``)."""
    cache = original.parent / "__pycache__"
    return sorted(cache.glob(f"{original.stem}.*.pyc")) if cache.is_dir() else []
