"""The judge: each task's verdict, computed outside the learner's sandbox.

For every task whose check is split (:mod:`course_lib.grading.split`), the judge finds the check
from the *solution's* check cell (never the learner's: a check cell the learner edited is only
reported), reads the plain data the learner's side handed back
(:func:`course_lib.grading.plain.decode`: no pickle, nothing the learner wrote is imported), draws
the same cases from the grading seed, and runs the check's judging half here. The task passes iff
that half returns and prints the ✓ line the solution stores.

A check that is not split (an instructor's own check written in a solution cell) is judged where
it runs, on the learner's side; the report names such tasks.
"""

from __future__ import annotations

import ast
import contextlib
import io
import os
import threading
from collections.abc import Iterator
from typing import Any

from course_lib.grading.clean import ANSWER_MARK, expected_lines
from course_lib.grading.isolate import CheckResult, check_call
from course_lib.grading.notebooks import SolutionTask
from course_lib.grading.report import TaskResult

__all__ = ["JudgeSide", "judge_task", "judges_for", "seed_env"]


@contextlib.contextmanager
def seed_env(seed: int) -> Iterator[None]:
    """The grading seed in this process's environment while the block runs (the checks read it
    through :func:`course_lib.grading.seeds.grading_seed`)."""
    from course_lib.grading.seeds import SEED_ENV

    before = os.environ.get(SEED_ENV)
    os.environ[SEED_ENV] = str(seed)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(SEED_ENV, None)
        else:
            os.environ[SEED_ENV] = before


def _imports_of(solution_nb: Any) -> dict[str, Any]:
    """The names the solution's own cells import (its ``unit``), nothing else of them run."""
    namespace: dict[str, Any] = {}
    for cell in solution_nb.cells:
        if cell.cell_type != "code" or ANSWER_MARK in cell.source:
            continue
        try:
            tree = ast.parse(cell.source)
        except SyntaxError:
            continue
        for stmt in tree.body:
            if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                module = ast.Module(body=[stmt], type_ignores=[])
                with contextlib.suppress(Exception):
                    exec(compile(module, "<solution imports>", "exec"), namespace)
    return namespace


def judges_for(unit: str, solution_nb: Any, expected: dict[int, SolutionTask]) -> dict[int, Any]:
    """Task -> its :class:`~course_lib.grading.split.SplitCheck`, for every task whose solution
    check cell calls one (``unit.checks.check_x(...)``)."""
    from course_lib.grading.split import SplitCheck

    namespace = _imports_of(solution_nb)
    found = {}
    for task, spec in expected.items():
        try:
            call = check_call(spec.source)
            check = eval(compile(ast.Expression(call.func), "<check>", "eval"), dict(namespace))
        except Exception:  # noqa: BLE001 - a check defined in a cell: judged where it runs
            continue
        if isinstance(check, SplitCheck):
            found[task] = check
    return found


class JudgeSide:
    """What the judge prepares while the learner's side runs (a thread of the grader, running
    no learner code): which tasks' checks are split (from the solution), their inputs (the
    second message into the sandbox), the imports the judges will need, and what the checks
    with an ``expect`` compare with. ``start()``, then ``join()`` before judging."""

    def __init__(self, unit: str, solution_nb: Any, expected: dict[int, SolutionTask], seed: int):
        self.unit, self.solution_nb, self.tasks, self.seed = unit, solution_nb, expected, seed
        self.judges: dict[int, Any] = {}
        self.inputs: dict[int, Any] = {}
        self.expected: dict[int, Any] = {}
        self.error: BaseException | None = None
        self._inputs_ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="judge-side", daemon=True)

    def start(self) -> JudgeSide:
        self._thread.start()
        return self

    def encoded_inputs(self) -> dict[str, Any]:
        """The second message: each split check's inputs, encoded (waits for them)."""
        from course_lib.grading import plain

        self._inputs_ready.wait()
        return {str(t): plain.encode(v) for t, v in self.inputs.items()}

    def join(self) -> None:
        self._thread.join()
        if self.error is not None:
            raise self.error

    def _run(self) -> None:
        try:
            with seed_env(self.seed):
                self.judges = judges_for(self.unit, self.solution_nb, self.tasks)
                self.inputs = {
                    t: judge.inputs(t) for t, judge in self.judges.items() if judge.prepare
                }
                self._inputs_ready.set()
                self._warm()
                self.expected = {
                    t: judge.expected(t) for t, judge in self.judges.items() if judge.expect
                }
        except BaseException as exc:  # noqa: BLE001 - raised again in join()
            self.error = exc
        finally:
            self._inputs_ready.set()

    def _warm(self) -> None:
        """Import what the judges use (torch, the course's modules the unit's checks name) now,
        not after the learner's side. A reference outside the course (a torch function a task
        forbids, e.g. unit 12's ``torch.distributed.pipelining._utils``, 2.6 s of CPU with what
        it imports) is something the learner may not call, not something a judge uses: a judge
        that does need it imports it itself."""
        if not self.judges:
            return
        import importlib

        from course_lib.grading.absent import unit_references

        with contextlib.suppress(Exception):
            importlib.import_module("torch")
            for spec in unit_references(self.unit):
                module = spec.partition(":")[0]
                if module.startswith("course_lib."):
                    importlib.import_module(module)


def _fail(spec: SolutionTask, message: str, tampered: str = "") -> TaskResult:
    return TaskResult(spec.task, spec.points, False, message[:500], tampered)


def judge_task(
    spec: SolutionTask, judge: Any, result: Any, inputs: Any = None, expected: Any = None
) -> TaskResult:
    """Task ``spec.task``'s verdict from what its learner side handed back (``result``: the
    reply's entry for it, untrusted)."""
    if not isinstance(result, dict):
        return _fail(spec, f"✗ task {spec.task}: the learner's side handed back nothing")
    if judge is None:
        return _inside_verdict(spec, result)
    data_text = result.get("data")
    if not isinstance(data_text, str):
        message = result.get("message")
        text = message if isinstance(message, str) else ""
        if text.startswith("✗"):
            return _fail(spec, text)
        if result.get("passed") is True or text.startswith("✓"):
            # only the judge gives a verdict: one from the learner's side was written by hand
            return _fail(
                spec,
                f"✗ task {spec.task}: the notebook's code sent a verdict of its own instead of "
                "its results; only the judge gives one",
                "forged a verdict",
            )
        return _fail(spec, f"✗ task {spec.task}: {text or 'the check handed back no results'}")
    from course_lib.grading import plain, verdicts

    try:
        data = plain.decode(data_text)
    except plain.PlainDataError as exc:
        return _fail(spec, f"✗ task {spec.task}: the run handed back data that is not plain: {exc}")
    verdicts.recorded.clear()
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            judge.run_judge(data, task=spec.task, inputs=inputs, expected=expected)
    except AssertionError as exc:
        lines = str(exc).strip().splitlines()
        return _fail(spec, lines[0] if lines else f"✗ task {spec.task}: AssertionError")
    except Exception as exc:  # noqa: BLE001 - data the judge cannot read fails the task
        first = (str(exc).strip().splitlines() or [""])[0]
        return _fail(
            spec,
            f"✗ task {spec.task}: the check cannot judge what the run handed back: "
            f"{type(exc).__name__}: {first}",
        )
    got = [line for task, line in verdicts.recorded if task == spec.task]
    if not got:
        return _fail(spec, f"✗ task {spec.task}: the check gave no verdict")
    want = expected_lines(spec)
    if want and [line.rstrip() for line in got] != want:
        return _fail(spec, f"the check printed {got[0]!r} where the solution's prints {want[0]!r}")
    return TaskResult(spec.task, spec.points, True, got[0])


def _inside_verdict(spec: SolutionTask, result: dict[str, Any]) -> TaskResult:
    """A check that is not split: its verdict as the learner's side gave it."""
    from course_lib.grading.clean import clean_verdict

    try:
        check = CheckResult(
            passed=result.get("passed") is True,
            message=str(result.get("message", ""))[:500],
            lines=[str(x) for x in result.get("lines", [])][:20],
            tampered=[str(x) for x in result.get("tampered", [])][:20],
        )
    except TypeError:
        return _fail(spec, f"✗ task {spec.task}: the learner's side sent an unreadable result")
    return clean_verdict(check, spec)
