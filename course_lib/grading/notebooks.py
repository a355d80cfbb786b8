"""Reading course notebooks: canonical JSON, cell tags, graded tasks and points (what the exercise
generator :mod:`course_lib.grading.exercises` and the grader share; re-exported by exercises).
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path

from course_lib.catalogue import NOTEBOOK_NAME, stems

CHECK_TAG = "NBVAL_CHECK_OUTPUT"
SOLUTION_NAME = NOTEBOOK_NAME  # a unit's notebook file name (course_lib.catalogue)
_TASK_TAG = re.compile(r"^task-(.*)$")
_POINTS_TAG = re.compile(r"^points-(.*)$")


_CELL_ID = re.compile(r"^[a-zA-Z0-9_\-]{1,64}$")


class ExerciseError(ValueError):
    """A solution or exercise notebook is malformed; the message names file, cell and line."""


# --------------------------------------------------------------------------- notebook helpers
def load_notebook_json(path: Path | str) -> tuple[str, dict]:
    """(text, parsed JSON) of a notebook file, checked to be a format-4 notebook; no nbformat import.

    Raises ExerciseError with one line naming the file and the problem.
    """
    path = Path(path)
    if not path.exists():
        raise ExerciseError(f"{path}: no such file")
    if path.is_dir():
        raise ExerciseError(f"{path}: is a directory, not a notebook (.ipynb) file")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ExerciseError(f"{path}: cannot read it as UTF-8 text ({exc})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ExerciseError(f"{path}: not a Jupyter notebook (invalid JSON: {exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("cells"), list):
        raise ExerciseError(f"{path}: not a Jupyter notebook (no 'cells' list in the JSON)")
    if data.get("nbformat") != 4:
        raise ExerciseError(
            f"{path}: not a Jupyter notebook in format 4 (nbformat={data.get('nbformat')!r}; "
            "open and save it in JupyterLab to upgrade it)"
        )
    if not isinstance(data.get("metadata", {}), dict):
        raise ExerciseError(f"{path}: not a Jupyter notebook ('metadata' is not an object)")
    return text, data


def read_notebook(path: Path | str):
    """Read a notebook as nbformat v4, or raise ExerciseError saying why it is not one."""
    import nbformat

    path = Path(path)
    text, _ = load_notebook_json(path)
    logger = logging.getLogger(
        "nbformat"
    )  # nbformat logs schema nits; we judge structure ourselves
    previous = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        nb = nbformat.reads(text, as_version=4)
    except Exception as exc:  # noqa: BLE001 - any reader failure means "not a notebook"
        raise ExerciseError(
            f"{path}: not a Jupyter notebook ({type(exc).__name__}: {exc})"
        ) from None
    finally:
        logger.setLevel(previous)
    for index, cell in enumerate(nb.cells):
        if not isinstance(cell, dict) or "cell_type" not in cell or "source" not in cell:
            raise ExerciseError(
                f"{path}: not a Jupyter notebook (cell index {index} has no cell_type/source)"
            )
    return nb


def cell_tags(cell) -> list[str]:
    tags = cell.get("metadata", {}).get("tags", [])
    return [t for t in tags if isinstance(t, str)] if isinstance(tags, list) else []


def cell_task(cell, *, where: str = "notebook", index: int = -1) -> int | None:
    """The task number of a cell tagged ``task-N`` (None if untagged)."""
    found = [m.group(1) for t in cell_tags(cell) if (m := _TASK_TAG.match(t))]
    if not found:
        return None
    if len(found) > 1:
        raise ExerciseError(
            f"{where}: cell index {index} has several task tags {found}; use one task-N"
        )
    if not found[0].isdigit():
        raise ExerciseError(
            f"{where}: cell index {index} has tag 'task-{found[0]}'; task tags are task-N with N a whole number"
        )
    return int(found[0])


def cell_points(cell, *, where: str = "notebook", index: int = -1) -> int | float:
    """Points of a graded cell: tag ``points-P`` (default 1)."""
    found = [m.group(1) for t in cell_tags(cell) if (m := _POINTS_TAG.match(t))]
    if not found:
        return 1
    try:
        value = float(found[-1])
    except ValueError:
        value = -1.0
    if len(found) > 1 or not value > 0 or value != value:
        raise ExerciseError(
            f"{where}: cell index {index} has points tags {found}; use one points-P with P > 0 (e.g. points-2)"
        )
    return int(value) if value.is_integer() else value


@dataclass(frozen=True)
class SolutionTask:
    """A graded check cell of a solution notebook."""

    task: int  # N of the task-N tag
    points: int | float  # P of the points-P tag, default 1
    cell_index: int  # index in the solution's cells
    source: str  # the check cell's code
    outputs: list  # the stored, expected outputs


def solution_tasks(nb, path: Path | str) -> dict[int, SolutionTask]:
    """Graded check cells of a solution, by task number; validates tags and stored outputs."""
    where = str(path)
    tasks: dict[int, SolutionTask] = {}
    for index, cell in enumerate(nb.cells):
        task = cell_task(cell, where=where, index=index)
        if task is None:
            continue
        if cell.cell_type != "code":
            raise ExerciseError(
                f"{where}: cell index {index} is {cell.cell_type}, but tag task-{task} needs a code cell"
            )
        if CHECK_TAG not in cell_tags(cell):
            raise ExerciseError(
                f"{where}: cell index {index} has tag task-{task} but not {CHECK_TAG}; add it"
            )
        if task in tasks:
            raise ExerciseError(
                f"{where}: task-{task} tags two cells (index {tasks[task].cell_index} and {index}); one check cell per task"
            )
        if not cell.get("outputs") or cell.get("execution_count") is None:
            raise ExerciseError(
                f"{where}: check cell index {index} (task-{task}) has no stored output; execute the solution "
                f"first: python -m course_tools.execute {where}"
            )
        tasks[task] = SolutionTask(
            task,
            cell_points(cell, where=where, index=index),
            index,
            cell.source,
            list(cell.outputs),
        )
    return dict(sorted(tasks.items()))


def render_notebook(nb) -> str:
    """Canonical text of a notebook: nbformat's JSON (sorted keys, indent=1) plus a trailing newline."""
    import nbformat

    nbformat.validate(nb)
    text = nbformat.writes(nb, version=4)
    return text if text.endswith("\n") else text + "\n"


def unit_names(solutions_dir: Path | str) -> list[str]:
    """Units (``NN_topic``) that have a solution notebook in ``solutions_dir``."""
    return stems(solutions_dir)  # the catalogue's one file-name rule
