"""The grade's verdicts, task by task, each from a clean process (:mod:`.isolate`).

Builds one :class:`~course_lib.grading.isolate.CheckJob` per task from the solution (its
non-answer cells, its check cell) and the learner's notebook (every code cell but the check
cells), runs it, and turns the result into the task's :class:`TaskResult`: passed iff the check
returned, recorded the ✓ line the solution stores, and found ``course_lib`` unchanged.
"""

from __future__ import annotations

from typing import Any

from course_lib.grading.isolate import CheckJob, CheckResult
from course_lib.grading.notebooks import ExerciseError, SolutionTask, cell_task
from course_lib.grading.report import TaskResult

__all__ = ["clean_verdict", "expected_lines", "jobs_for"]

ANSWER_MARK = "### BEGIN SOLUTION"


def _is_check(cell: Any, where: str, index: int) -> bool:
    try:
        return cell_task(cell, where=where, index=index) is not None
    except ExerciseError:
        return True  # a malformed task tag: never carried as the learner's code


def jobs_for(
    unit: str,
    solution_nb: Any,
    learner_nb: Any,
    expected: dict[int, SolutionTask],
) -> dict[int, CheckJob]:
    """The clean-process job of every task (``unit``: the unit's package name)."""
    code = [(i, c) for i, c in enumerate(solution_nb.cells) if c.cell_type == "code"]
    answers = [i for i, c in code if ANSWER_MARK in c.source]
    first_answer = answers[0] if answers else len(solution_nb.cells)
    course = [
        (i, c.source) for i, c in code if ANSWER_MARK not in c.source and not _is_check(c, "", i)
    ]
    learner = [
        c.source
        for i, c in enumerate(learner_nb.cells)
        if c.cell_type == "code" and not _is_check(c, "", i)
    ]
    return {
        task: CheckJob(
            task=task,
            unit=unit,
            setup=[s for i, s in course if i < first_answer],
            learner=learner,
            later=[s for i, s in course if first_answer < i < spec.cell_index],
            check=spec.source,
        )
        for task, spec in expected.items()
    }


def expected_lines(spec: SolutionTask) -> list[str]:
    """The ✓ lines the solution's check cell printed."""
    text = "".join(
        str(o.get("text", ""))
        for o in spec.outputs
        if o.get("output_type") == "stream" and o.get("name") == "stdout"
    )
    return [line.rstrip() for line in text.splitlines() if line.startswith("✓")]


def clean_verdict(result: CheckResult, spec: SolutionTask) -> TaskResult:
    """Task ``spec.task``'s result from its clean process's ``result``."""
    tampered = "course_lib changed during the check" if result.tampered else ""
    if not result.passed:
        return TaskResult(spec.task, spec.points, False, result.message, tampered)
    want = expected_lines(spec)
    got = [line.rstrip() for line in result.lines]
    if want and got != want:
        return TaskResult(
            spec.task,
            spec.points,
            False,
            f"the check printed {got[0]!r} where the solution's prints {want[0]!r}",
        )
    return TaskResult(spec.task, spec.points, True, result.message)
