"""Run one graded check in a clean process: the verdict a grade stands on.

The grade command runs the learner's notebook in a kernel (their cells, their errors), but the
checks' verdicts come from here, one fresh Python process per task:

1. a clean import of ``course_lib`` and of the unit being graded; the course's own answers named
   by the unit's checks are trapped (:mod:`course_lib.grading.traps`) and the loaded modules are
   fingerprinted (:mod:`course_lib.grading.integrity`), before any learner code runs;
2. the solution's own non-answer cells that come before the first answer (imports, ``unit``);
3. the learner's *definitions*, carried by source from every cell of their notebook except the
   check cells: functions, classes, imports and constants written as literals
   (``GB = 10**9``). No other top-level statement of theirs runs here (a cell that rebinds
   ``unit`` or patches a check does nothing), so a helper function or a constant in another
   cell still counts;
4. the solution's non-answer cells between the first answer and this task's check cell, as the
   course wrote them (a class the answer uses, a demo);
5. the task's check cell, from the solution, with the names the course's setup cells bound
   restored. It passes iff it returns, the ✓ line ``passed`` recorded for this task is the one
   the solution stores, and no ``course_lib`` module changed (checked before and after: a change
   fails the task as tampered).

Step 1 happens once per notebook in a process that has run no learner code
(:mod:`course_lib.grading.zygote`); each task then runs in a process forked from it, so every
check starts from the same clean import without paying for it again. The cases a check draws
come from ``$COURSE_GRADE_SEED`` (:mod:`course_lib.grading.seeds`).
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass, field
from typing import Any

__all__ = ["CheckJob", "CheckResult", "carried_statements", "prepare", "run_job"]


@dataclass(frozen=True)
class CheckJob:
    task: int
    unit: str  # the unit's package, e.g. "course_lib.units.u05_cpu_offload"
    setup: list[str]  # the solution's non-answer cells before its first answer cell
    learner: list[str]  # the learner's code cells (not check cells), whole; filtered in the child
    later: list[str]  # the solution's non-answer cells after the first answer, before this check
    check: str  # the solution's check cell
    # "collect": a split check's learner side only (its plain data comes back, the judge is
    # outside); "verdict": the whole check here; "auto": collect if the check is split
    mode: str = "verdict"
    inputs: str | None = None  # a split check's judge-side inputs (plain data, encoded)


@dataclass
class CheckResult:
    passed: bool
    message: str  # the ✓ line, or the ✗ line / what went wrong
    lines: list[str] = field(default_factory=list)  # the ✓ lines recorded for the task
    tampered: list[str] = field(default_factory=list)  # course_lib changes seen
    data: str | None = None  # a split check's learner side: its plain data, encoded


# --------------------------------------------------------------------------- what is carried
_LITERAL_NODES = (
    ast.Constant,
    ast.Tuple,
    ast.List,
    ast.Set,
    ast.Dict,
    ast.UnaryOp,
    ast.BinOp,
    ast.Load,
    ast.unaryop,
    ast.operator,
)


def _is_literal(node: ast.AST, constants: set[str]) -> bool:
    """Constants, containers of them and arithmetic on them (names of earlier constants too)."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            if sub.id not in constants:
                return False
        elif not isinstance(sub, _LITERAL_NODES):
            return False
    return True


def _targets(stmt: ast.Assign | ast.AnnAssign) -> list[str] | None:
    """The plain names an assignment binds, or None if it binds anything else."""
    targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
    names: list[str] = []
    for target in targets:
        elements = target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target]
        if not all(isinstance(e, ast.Name) for e in elements):
            return None
        names += [e.id for e in elements if isinstance(e, ast.Name)]
    return names


def carried_statements(tree: ast.Module, constants: set[str]) -> list[ast.stmt]:
    """The statements of a learner cell that go to the clean process; ``constants`` (the names
    of literal constants carried so far) is updated."""
    kept: list[ast.stmt] = []
    defs = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Import, ast.ImportFrom)
    for stmt in tree.body:
        if isinstance(stmt, defs):
            kept.append(stmt)
        elif isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None:
            names = _targets(stmt)
            if names is not None and _is_literal(stmt.value, constants):
                kept.append(stmt)
                constants.update(names)
    return kept


def _python_source(source: str) -> str:
    """A cell's source with IPython's syntax (magics, ``!cmd``) turned into Python."""
    try:
        from IPython.core.inputtransformer2 import TransformerManager
    except ImportError:  # no IPython: plain Python cells only
        return source
    return str(TransformerManager().transform_cell(source))


# --------------------------------------------------------------------------- one task
def run_job(job: CheckJob) -> CheckResult:
    """Steps 2-5 of the module doc, in this (forked, clean) process."""
    from course_lib.grading import integrity, verdicts

    integrity.take_snapshot()
    namespace = sys.modules["__main__"].__dict__
    for source in job.setup:
        _run_cell(source, namespace, "setup")
    course_names = {k: v for k, v in namespace.items() if not k.startswith("__")}
    constants: set[str] = set()
    for index, source in enumerate(job.learner):
        _run_definitions(source, namespace, constants, f"<your cell {index + 1}>")
    for source in job.later:
        _run_cell(source, namespace, "course cell")
    changed = integrity.changes()
    if changed:
        return _tampered(job.task, changed)
    check_namespace = dict(namespace)
    check_namespace.update(course_names)
    if job.mode == "collect" or (job.mode == "auto" and _split(job, check_namespace)):
        return _collect(job, check_namespace)
    verdicts.recorded.clear()
    try:
        exec(compile(job.check, f"<check of task {job.task}>", "exec"), check_namespace)
    except AssertionError as exc:
        lines = str(exc).strip().splitlines()
        return CheckResult(False, lines[0] if lines else "AssertionError")
    except BaseException as exc:  # noqa: BLE001 - a learner's SystemExit, KeyboardInterrupt...
        return CheckResult(False, f"the check stopped: {type(exc).__name__}: {exc}")
    changed = integrity.changes()
    if changed:
        return _tampered(job.task, changed)
    mine = [line for task, line in verdicts.recorded if task == job.task]
    if not mine:
        return CheckResult(False, f"the check of task {job.task} gave no verdict")
    return CheckResult(True, mine[0], mine)


def check_call(source: str) -> ast.Call:
    """The one call a check cell makes (``unit.checks.check_x(answer, ...)``); ValueError if
    the cell is anything else."""
    tree = ast.parse(source)
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.Expr):
        raise ValueError("a check cell must be one call of a check")
    call = tree.body[0].value
    if not isinstance(call, ast.Call) or any(isinstance(a, ast.Starred) for a in call.args):
        raise ValueError("a check cell must be one call of a check")
    if any(kw.arg is None for kw in call.keywords):
        raise ValueError("a check cell's keywords must be named")
    return call


def _split(job: CheckJob, namespace: dict[str, Any]) -> bool:
    """Whether the job's check cell calls a split check (evaluating only the called name)."""
    from course_lib.grading.split import SplitCheck

    try:
        func = check_call(job.check).func
        found = eval(compile(ast.Expression(func), "<check>", "eval"), dict(namespace))
    except Exception:  # noqa: BLE001 - not a call of a split check: judged here, as written
        return False
    return isinstance(found, SplitCheck)


def _collect(job: CheckJob, namespace: dict[str, Any]) -> CheckResult:
    """A split check's learner side (:mod:`course_lib.grading.split`): the learner's code run on
    the seeded cases; its plain data goes back, the verdict is the judge's (outside)."""
    from course_lib.grading import plain
    from course_lib.grading.split import SplitCheck

    def value(node: ast.expr) -> Any:
        return eval(compile(ast.Expression(node), f"<check of task {job.task}>", "eval"), namespace)

    try:
        call = check_call(job.check)
        check = value(call.func)
        if not isinstance(check, SplitCheck):
            raise TypeError(f"{call.func!r} is not a split check")
        args = [value(a) for a in call.args]
        kwargs = {kw.arg: value(kw.value) for kw in call.keywords if kw.arg}
        inputs = plain.decode(job.inputs) if job.inputs is not None else None
        data = check.run_collect(*args, inputs=inputs, **kwargs)
        return CheckResult(False, "", data=plain.encode(data))
    except BaseException as exc:  # noqa: BLE001 - a learner's SystemExit, KeyboardInterrupt...
        return CheckResult(False, f"the check stopped: {type(exc).__name__}: {exc}"[:500])


def _tampered(task: int, changed: list[str]) -> CheckResult:
    shown = "; ".join(changed[:3]) + (f" (and {len(changed) - 3} more)" if len(changed) > 3 else "")
    return CheckResult(
        False, f"✗ task {task}: tampered: the course's code changed: {shown}", tampered=changed
    )


def prepare(unit: str) -> None:
    """Import the unit and its checks; trap every course answer its checks name."""
    import importlib
    import importlib.util

    from course_lib.grading import traps
    from course_lib.grading.references import reference_functions

    traps.keep_installed()
    try:
        known = importlib.util.find_spec(unit) is not None
    except ModuleNotFoundError:
        known = False
    if not known:  # a solution outside the course's units (an instructor's own, a test's)
        return
    checks = importlib.import_module(f"{unit}.checks")
    specs: list[str] = []
    for value in vars(checks).values():
        items = [value] if isinstance(value, str) else value
        if isinstance(items, (list, tuple)):
            specs += [s for s in items if isinstance(s, str) and _looks_like_reference(s)]
    for spec in specs:
        try:
            traps.trap_functions(reference_functions([spec]))
        except (ValueError, ImportError):
            continue  # not a reference after all; the check's own watch names it if it is


def _looks_like_reference(text: str) -> bool:
    module, sep, qualname = text.partition(":")
    return bool(sep) and module.replace(".", "").replace("_", "").isalnum() and qualname != ""


def _run_cell(source: str, namespace: dict[str, Any], where: str) -> None:
    try:
        exec(compile(_python_source(source), f"<{where}>", "exec"), namespace)
    except BaseException:  # noqa: BLE001 - a demo that fails (the learner's stub) is not the verdict
        pass


def _run_definitions(
    source: str, namespace: dict[str, Any], constants: set[str], filename: str
) -> None:
    try:
        tree = ast.parse(_python_source(source), filename)
    except SyntaxError:
        return
    for stmt in carried_statements(tree, constants):
        module = ast.Module(body=[stmt], type_ignores=[])
        try:
            exec(compile(module, filename, "exec"), namespace)
        except BaseException:  # noqa: BLE001 - one definition that fails does not drop the rest
            pass
