"""Tamper evidence: which graded check cells a learner edited, moved, deleted or added.

The grader always runs the solution's own check code in a task's check cell, so an edit cannot
change a verdict; this module says what was changed, so that the report and its JSON name it
("the check cell of task 3 was edited; graded with the original").

* edited: the cell's code differs from the course's (trailing whitespace ignored);
* moved: the cells of the course that precede it (by cell id, nbformat >= 4.5) are not the ones
  that precede it in the solution; cells the learner added or deleted do not count;
* deleted: no code cell tagged ``task-N`` is left for a task;
* added: a second cell tagged ``task-N``, or a ``task-N`` the solution does not grade.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from course_lib.grading.notebooks import ExerciseError, SolutionTask, cell_task

__all__ = ["check_cell_changes", "describe_change"]


def _normalised(source: str) -> str:
    return "\n".join(line.rstrip() for line in source.strip().splitlines())


def _task_cells(nb: Any) -> dict[int, list[int]]:
    """Indices of the code cells tagged ``task-N``, by N (a malformed tag is ignored)."""
    found: dict[int, list[int]] = {}
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        try:
            task = cell_task(cell, index=index)
        except ExerciseError:
            continue
        if task is not None:
            found.setdefault(task, []).append(index)
    return found


def _preceding(ids: Sequence[str | None], upto: int, common: set[str]) -> set[str]:
    return {i for i in ids[:upto] if i in common}


def _moved(nb: Any, index: int, solution_ids: Sequence[str | None], spec: SolutionTask) -> bool:
    ids = [cell.get("id") for cell in nb.cells]
    if not all(solution_ids) or not all(ids):
        return False  # notebooks without cell ids (nbformat < 4.5): order cannot be traced
    own = {ids[index], solution_ids[spec.cell_index]}
    common = (set(ids) & set(solution_ids)) - own
    return _preceding(ids, index, common) != _preceding(solution_ids, spec.cell_index, common)


def check_cell_changes(
    nb: Any, expected: Mapping[int, SolutionTask], solution_ids: Sequence[str | None]
) -> dict[int, list[str]]:
    """What was done to each task's check cell: task -> ["edited", "moved", ...] (changed tasks only).

    ``nb`` is the learner's notebook as read (before the grader restores check code),
    ``expected`` the solution's graded tasks, ``solution_ids`` the solution's cell ids in order.
    """
    cells = _task_cells(nb)
    changes: dict[int, list[str]] = {}
    for task, indices in cells.items():
        if task not in expected or len(indices) > 1:
            changes.setdefault(task, []).append("added")
    for task, spec in expected.items():
        if task not in cells:
            changes.setdefault(task, []).append("deleted")
            continue
        index = cells[task][0]
        if _normalised(nb.cells[index].source) != _normalised(spec.source):
            changes.setdefault(task, []).append("edited")
        if _moved(nb, index, solution_ids, spec):
            changes.setdefault(task, []).append("moved")
    return dict(sorted(changes.items()))


def describe_change(task: int, kind: str, graded: bool = True) -> str:
    """One report line for one change, e.g. "the check cell of task 3 was edited; graded with the
    original"."""
    if kind == "added":
        if not graded:
            return f"a cell tagged task-{task} was added; the solution grades no task {task}"
        return (
            f"a second check cell for task {task} was added; the first is graded, with the original"
        )
    return (
        f"the check cell of task {task} was {kind}; "
        + {
            "edited": "graded with the original",
            "moved": "graded where it now stands",
            "deleted": "the task scores 0",
        }[kind]
    )
