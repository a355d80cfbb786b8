"""An exercise made from its solution, and a learner's way to start one over.

    python -m course_lib.grading.exercises reset NN   # start unit NN's exercise over (a backup kept)

``python -m course_tools.exercises build|check`` (``make exercises``) writes and checks the whole
``exercises/`` folder from ``solutions/`` (the source of truth) with :func:`make_exercise`; a
reset writes one exercise back the same way, so the transformation lives here, with the grader
(one notebook's transformation is ``exercise_transform.py``, re-exported here). For each
``solutions/NN_topic.ipynb`` the generator writes ``exercises/NN_topic.ipynb`` where

* every region from a ``### BEGIN SOLUTION`` line to its ``### END SOLUTION`` line (both included)
  becomes, at the BEGIN marker's indentation,
  ``raise NotImplementedError("FILL ME IN (roughly K lines)")``, K = the answer's non-blank,
  non-comment lines (the nbgrader markers, GPU-Puzzles-style hint);
* outputs and execution counts are cleared everywhere. A cell tagged ``NBVAL_CHECK_OUTPUT`` shows
  the solution's output as a visible *target*, never as a result: one output reading
  ``expected once your answer is right: ✓ task 1: ...`` (markdown, with a plain-text twin) and no
  execution count, so an unfilled check never looks passed. The solution's outputs themselves go
  in the cell's metadata, ``course.expected_outputs``: the learner's run of the cell replaces the
  target with their real output, and ``nbval`` compares against ``course.expected_outputs``
  through the pytest plugin :mod:`course_tools.nbval_targets` (loaded by the repository's
  ``conftest.py``; without it nbval refuses the cell as "Unrun reference cell has outputs", it
  never passes it). The grader compares with the solution file itself;
* a first markdown cell says how to work and how to grade, and two last cells grade the saved
  notebook from JupyterLab (:mod:`course_lib.grading.exercise_cells`); where the file comes from
  is notebook metadata, ``{"course": {"generated_from": "solutions/NN_topic.ipynb", "unit":
  "NN_topic"}}``, never text in the learner's view;
* the file is written canonically (sorted keys, indent=1, trailing newline, cell ids copied from
  the solution), so building twice gives byte-identical files and ``check`` can compare bytes.

A malformed solution (BEGIN without END, nested or stray markers, an empty answer, markers outside
code cells, a stored error output, a graded check cell without a stored output) raises
:class:`ExerciseError` naming the file, the cell index and the line.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from course_lib.grading.exercise_cells import BACKUP_DIR, GRADE_CELL_ID
from course_lib.grading.exercise_transform import (  # noqa: F401 (re-exported: the generator's API)
    BEGIN,
    END,
    TARGET_LABEL,
    expected_outputs,
    make_exercise,
    strip_solution,
    target_output,
)
from course_lib.grading.notebooks import (  # noqa: F401 (re-exported: the grader and tests)
    _CELL_ID,
    CHECK_TAG,
    SOLUTION_NAME,
    ExerciseError,
    SolutionTask,
    cell_points,
    cell_tags,
    cell_task,
    load_notebook_json,
    read_notebook,
    render_notebook,
    solution_tasks,
    unit_names,
)

__all__ = [
    "GRADE_CELL_ID",
    "TARGET_LABEL",
    "ExerciseError",
    "SolutionTask",
    "expected_outputs",
    "make_exercise",
    "main",
    "reset_exercise",
    "load_notebook_json",
    "read_notebook",
    "render_notebook",
    "target_output",
    "solution_tasks",
    "unit_names",
]


def reset_exercise(
    number: str, solutions_dir: Path | str = "solutions", out_dir: Path | str = "exercises"
) -> tuple[Path, Path | None]:
    """Write unit ``number``'s exercise as generated; (its path, the backup of the old file or None).

    ``number`` is the unit's two digits (``"3"`` means ``"03"``) or its full name
    (``"03_precision"``). The learner's file, when there is one, is moved to
    ``out_dir/backups/NN_topic-YYYYmmdd-HHMMSS.ipynb`` first.
    """
    solutions_dir, out_dir = Path(solutions_dir), Path(out_dir)
    if not solutions_dir.is_dir():
        raise ExerciseError(
            f"{solutions_dir}: no such solutions directory (run it from the course folder)"
        )
    key = number.zfill(2) if number.isdigit() else number
    units = unit_names(solutions_dir)
    found = [u for u in units if u == key or u.split("_", 1)[0] == key]
    if len(found) != 1:
        raise ExerciseError(
            f"unit = {number!r}: expected one of {', '.join(u.split('_', 1)[0] for u in units)}"
        )
    unit = found[0]
    solution = solutions_dir / f"{unit}.ipynb"
    text = render_notebook(
        make_exercise(read_notebook(solution), solution, solution_rel=f"solutions/{unit}.ipynb")
    )
    target, backup = out_dir / f"{unit}.ipynb", None
    if target.exists():
        backup = out_dir / BACKUP_DIR / f"{unit}-{time.strftime('%Y%m%d-%H%M%S')}.ipynb"
        backup.parent.mkdir(parents=True, exist_ok=True)
        target.replace(backup)
    out_dir.mkdir(parents=True, exist_ok=True)
    target.write_text(text, encoding="utf-8")
    return target, backup


def main(argv: list[str] | None = None) -> int:
    """``reset NN``: the pristine exercise back in place; says where the learner's file went."""
    parser = argparse.ArgumentParser(
        prog="python -m course_lib.grading.exercises",
        description="Start one exercise over (reset NN): the generated exercise is written back "
        "and the learner's file kept as a backup.",
    )
    parser.add_argument("command", choices=["reset"])
    parser.add_argument("unit", nargs="?", help="the unit's number, e.g. 03")
    parser.add_argument(
        "--solutions", default="solutions", help="solutions directory (default: solutions)"
    )
    parser.add_argument(
        "--out", default="exercises", help="exercises directory (default: exercises)"
    )
    args = parser.parse_args(argv)
    if not args.unit:
        print("error: reset needs the unit's number, e.g. reset 03", file=sys.stderr)
        return 2
    try:
        path, backup = reset_exercise(args.unit, args.solutions, args.out)
    except ExerciseError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    kept = f"; your previous file is {backup}" if backup else ""
    print(f"{path} is back as generated{kept}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
