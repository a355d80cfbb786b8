"""Sizes a maintainer can read in one sitting (CONTRIBUTING, "Code conventions").

Every module of course_lib and course_tools ≤ 400 lines, every file of course_lib/parallel ≤ 300
(picotron's measure: one parallelism idea per file), every function ≤ 50 lines not counting its
docstring.
The few places still over are listed in ``OVER`` with their size today: they may shrink, never
grow, and an entry that is back within its limit must be removed, so the list only gets shorter.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = (ROOT / "course_lib", ROOT / "course_tools")
MODULE_LINES = 400
PARALLEL_LINES = 300
FUNCTION_LINES = 50

# "package/path" (a module, e.g. "course_lib/plan/planner.py") or "package/path:qualified.name" (a
# function) -> lines today. Shrink it, never grow it.
OVER: dict[str, int] = {}


def _module_limit(rel: str) -> int:
    return PARALLEL_LINES if rel.startswith("parallel/") else MODULE_LINES


def _code_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines of a function, its docstring left out."""
    lines = (node.end_lineno or node.lineno) - node.lineno + 1
    first = node.body[0]
    if (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    ):
        lines -= (first.end_lineno or first.lineno) - first.lineno + 1
    return lines


def _functions(tree: ast.AST, prefix: str = ""):
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield prefix + node.name, node
            yield from _functions(node, prefix + node.name + ".")
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node, prefix + node.name + ".")
        else:
            yield from _functions(node, prefix)


def measure(package: Path) -> dict[str, tuple[int, int]]:
    """Every module and function of ``package`` over its limit: key -> (lines, limit)."""
    over: dict[str, tuple[int, int]] = {}
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package).as_posix()
        source = path.read_text(encoding="utf-8")
        lines = len(source.splitlines())
        if lines > _module_limit(rel):
            over[rel] = (lines, _module_limit(rel))
        for name, node in _functions(ast.parse(source)):
            n = _code_lines(node)
            if n > FUNCTION_LINES:
                over[f"{rel}:{name}"] = (n, FUNCTION_LINES)
    return over


def measure_all() -> dict[str, tuple[int, int]]:
    """:func:`measure` over both packages, each key starting with its package's name."""
    return {f"{p.name}/{key}": size for p in PACKAGES for key, size in measure(p).items()}


def test_modules_and_functions_within_their_limits():
    assert all(p.is_dir() for p in PACKAGES), PACKAGES
    over = measure_all()
    new = {k: v for k, v in over.items() if k not in OVER}
    grown = {k: (v[0], OVER[k]) for k, v in over.items() if k in OVER and v[0] > OVER[k]}
    assert not new, "over the size limit (lines, limit); split by idea: " + repr(new)
    assert not grown, "grew past its recorded size (lines, recorded): " + repr(grown)


def test_the_list_of_exceptions_only_shrinks():
    over = measure_all()
    back = sorted(k for k in OVER if k not in over)
    assert not back, f"within the limit now: remove from OVER in {Path(__file__).name}: {back}"
    shrunk = {k: over[k][0] for k in OVER if k in over and over[k][0] < OVER[k]}
    assert not shrunk, f"smaller now: record the new sizes in OVER: {shrunk}"


def test_the_measure_sees_an_oversized_function(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(FUNCTION_LINES))
    (tmp_path / "m.py").write_text(f'def f():\n    """Doc."""\n{body}\n\n\ndef g():\n    pass\n')
    assert measure(tmp_path) == {"m.py:f": (FUNCTION_LINES + 1, FUNCTION_LINES)}
    (tmp_path / "parallel").mkdir()
    (tmp_path / "parallel" / "p.py").write_text("x = 1\n" * (PARALLEL_LINES + 1))
    assert measure(tmp_path)["parallel/p.py"] == (PARALLEL_LINES + 1, PARALLEL_LINES)
