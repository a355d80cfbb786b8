"""Which of the kernel's own definitions can follow a notebook into its persistent ranks.

Part of :mod:`course_lib.ranks` (``%%ranks``). A rank is a separate process: it does not share
the kernel's variables. What *can* be carried over without changing the notebook's meaning is
re-run there from source, statement by statement, taken from every cell the kernel has run
successfully:

* ``import`` / ``from ... import`` statements;
* ``def`` / ``async def`` / ``class`` statements (decorators included);
* assignments of a plain literal (``N = 4``, ``SIZES = (1, 2)``; ``ast.literal_eval`` accepts it).

What cannot, and why:

* any other assignment (``t = torch.randn(3)``, ``model = GPT(cfg)``): re-running it would redo
  the computation and its side effects (files written, a launch, a random draw that then differs
  from the kernel's); send the value instead, ``ranks.push(t=t)`` (it travels by cloudpickle);
* statements inside ``if``/``for``/``with``/``try`` blocks: they depend on run-time state;
* magics and shell lines (``%time``, ``!ls``): the ranks run plain Python, without IPython;
* a definition whose own execution needs something missing in the ranks (a decorator or a
  default value computed from a kernel variable): it fails there, and the cell says so once.
"""

from __future__ import annotations

import ast

_DEFINITIONS = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _is_literal_assignment(node: ast.stmt) -> bool:
    if isinstance(node, ast.Assign):
        value = node.value
        targets_ok = all(isinstance(t, ast.Name) for t in node.targets)
    elif isinstance(node, ast.AnnAssign) and node.value is not None:
        value = node.value
        targets_ok = isinstance(node.target, ast.Name)
    else:
        return False
    if not targets_ok:
        return False
    try:
        ast.literal_eval(value)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False
    return True


def _label(node: ast.stmt, source: str) -> str:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return f"def {node.name}"
    if isinstance(node, ast.ClassDef):
        return f"class {node.name}"
    first = source.strip().splitlines()[0]
    return first if len(first) <= 80 else first[:77] + "..."


def definitions(code: str, filename: str) -> list[tuple[str, str, str]]:
    """(label, source, filename) of each top-level definition in one cell's Python ``code``
    (already transformed by IPython, so magics are plain ``get_ipython()`` calls, skipped)."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return []
    lines = code.splitlines(keepends=True)
    found = []
    for node in tree.body:
        if not (isinstance(node, _DEFINITIONS) or _is_literal_assignment(node)):
            continue
        start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        # keep the line numbers of the cell, so tracebacks in the ranks point at the right line
        source = "\n" * (start - 1) + "".join(lines[start - 1 : node.end_lineno])
        found.append((_label(node, source), source, filename))
    return found
