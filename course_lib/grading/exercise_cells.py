"""What the generator adds to every exercise for the learner, and where a reset keeps its file.

* a first markdown cell (id ``generated-header``): how to work, and the one way to grade from
  JupyterLab (the last cell, or one terminal line); where the file comes from stays in the
  notebook's metadata (``course.generated_from``), not in the learner's view;
* two last cells (ids ``grade-here-title``, ``grade-here``): a heading and a code cell calling
  :func:`course_lib.grading.here.grade_here`, which grades the saved notebook in a fresh kernel
  (the grader's own run of that cell does nothing);
* :data:`BACKUP_DIR`: where ``python -m course_lib.grading.exercises reset NN`` (in
  ``exercises.py``) keeps the learner's file before writing the pristine exercise back.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = [
    "BACKUP_DIR",
    "GRADE_CELL_ID",
    "HEADER_ID",
    "grade_cells",
    "header_cell",
]

HEADER_ID = "generated-header"
GRADE_TITLE_ID = "grade-here-title"
GRADE_CELL_ID = "grade-here"
BACKUP_DIR = "backups"  # below the exercises folder: never taken for an exercise by build/check
GRADE_SOURCE = (
    "# Save first (Ctrl+S): this grades the saved file in a fresh kernel, as an instructor does.\n"
    "from course_lib.grading import grade_here\n"
    "\n"
    "grade_here();"
)


def header_cell(unit: str) -> Any:
    """The exercise's first cell: how to work, how to grade, how to start over."""
    import nbformat

    number = unit.split("_", 1)[0]
    text = (
        'Replace every `raise NotImplementedError("FILL ME IN ...")` with your answer and run the '
        "notebook top to bottom. The check cells are a self-check: they answer ✓ or ✗ at once, "
        "in this kernel. Until you run them they show *expected once your answer is right: ...*: "
        "a target, not your result.\n"
        "\n"
        "**Your grade** is what the grade command gives, the way an instructor grades: save "
        "(Ctrl+S) and run the last cell, *Grade this notebook*, or type "
        f"`python -m course_lib.grade exercises/{unit}.ipynb` in JupyterLab's terminal (File > "
        "New > Terminal). It reruns the saved notebook in a fresh kernel inside a sandbox (no "
        "solutions, the course read-only, this unit's answers absent) on cases drawn for you, "
        "and judges each task outside it with the course's own checks.\n"
        "\n"
        f"To start this exercise over: `python -m course_lib.grading.exercises reset {number}` "
        f"(your file is kept in `exercises/{BACKUP_DIR}/`)."
    )
    cell = nbformat.v4.new_markdown_cell(text)
    cell.id = HEADER_ID
    cell.metadata = {"tags": ["generated"]}
    return cell


def _onward(unit: str, root: Path | None) -> str:
    """Links back to the unit's lecture and on to the next one (course root ``root``), or ""."""
    from course_lib import catalogue

    if root is None or not (root / "notebooks" / f"{unit}.ipynb").is_file():
        return ""
    _, this, after = catalogue.neighbours(unit, root)
    links = [f"Back to the lecture: [{this.label}](../notebooks/{this.stem}.ipynb)"]
    if after is not None:
        links.append(f"Next: [{after.label}](../notebooks/{after.stem}.ipynb)")
    return "\n\n" + "; ".join(links) + "."


def grade_cells(unit: str = "", root: Path | None = None) -> list[Any]:
    """The exercise's last two cells: a heading (with links to the unit's lecture and the next
    unit when the course at ``root`` has them) and the cell that grades the notebook."""
    import nbformat

    title = nbformat.v4.new_markdown_cell(
        "## Grade this notebook\n\nSave (Ctrl+S), then run the cell below." + _onward(unit, root)
    )
    title.id = GRADE_TITLE_ID
    title.metadata = {"tags": ["generated"]}
    code = nbformat.v4.new_code_cell(GRADE_SOURCE)
    code.id = GRADE_CELL_ID
    code.metadata = {"tags": ["generated"]}
    return [title, code]
