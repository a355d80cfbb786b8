"""One solution notebook made into its exercise (:func:`make_exercise`): the transformation
``python -m course_lib.grading.exercises`` applies to every ``solutions/NN_topic.ipynb``, read
its docstring (exercises.py, which re-exports this module). The cells added for the learner are
in ``exercise_cells.py``.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

from course_lib.grading.exercise_cells import HEADER_ID, grade_cells, header_cell
from course_lib.grading.notebooks import (
    _CELL_ID,
    CHECK_TAG,
    ExerciseError,
    cell_tags,
    solution_tasks,
)

__all__ = [
    "BEGIN",
    "END",
    "TARGET_LABEL",
    "expected_outputs",
    "make_exercise",
    "strip_solution",
    "target_output",
]

BEGIN = "### BEGIN SOLUTION"
END = "### END SOLUTION"
_BEGIN_LINE = re.compile(r"^(?P<indent>[ \t]*)#+[ \t]*BEGIN SOLUTION[ \t]*$")
_END_LINE = re.compile(r"^(?P<indent>[ \t]*)#+[ \t]*END SOLUTION[ \t]*$")
# what an exercise's check cell shows before the learner runs it: a target, not a result
TARGET_LABEL = "expected once your answer is right:"


# --------------------------------------------------------------------------- the transformation
def _count_answer_lines(lines: list[str]) -> int:
    return sum(1 for line in lines if line.strip() and not line.strip().startswith("#"))


def _hint(indent: str, k: int) -> str:
    return (
        f'{indent}raise NotImplementedError("FILL ME IN (roughly {k} line{"" if k == 1 else "s"})")'
    )


def strip_solution(source: str, *, where: str, index: int) -> str:
    """Replace each BEGIN..END SOLUTION region of a code cell's source by a NotImplementedError hint."""
    lines = source.split("\n")
    out: list[str] = []
    begin: tuple[int, str] | None = None  # (line number, indent) of the open region
    answer: list[str] = []
    for number, line in enumerate(lines, start=1):
        b, e = _BEGIN_LINE.match(line), _END_LINE.match(line)
        if b:
            if begin is not None:
                raise ExerciseError(
                    f"{where}: cell index {index}, line {number}: nested '{BEGIN}' (the region opened at "
                    f"line {begin[0]} is not closed); add '{END}' before it"
                )
            begin, answer = (number, b.group("indent")), []
        elif e:
            if begin is None:
                raise ExerciseError(
                    f"{where}: cell index {index}, line {number}: '{END}' without a '{BEGIN}' before it"
                )
            k = _count_answer_lines(answer)
            if k == 0:
                raise ExerciseError(
                    f"{where}: cell index {index}, line {begin[0]}: empty solution region (no code between the markers)"
                )
            out.append(_hint(begin[1], k))
            begin = None
        elif "BEGIN SOLUTION" in line or "END SOLUTION" in line:
            raise ExerciseError(
                f"{where}: cell index {index}, line {number}: malformed marker {line.strip()!r}; a marker is "
                f"a line of its own: '{BEGIN}' or '{END}'"
            )
        elif begin is not None:
            answer.append(line)
        else:
            out.append(line)
    if begin is not None:
        raise ExerciseError(
            f"{where}: cell index {index}, line {begin[0]}: '{BEGIN}' without a matching '{END}'"
        )
    return "\n".join(out)


def _output_text(outputs: list) -> str:
    """The text a list of outputs shows: streams and text/plain, in order."""
    parts = []
    for output in outputs:
        if output.get("output_type") == "stream":
            text = output.get("text", "")
        elif output.get("output_type") == "error":
            text = f"{output.get('ename', 'Error')}: {output.get('evalue', '')}"
        else:
            text = output.get("data", {}).get("text/plain", "")
        parts.append("".join(text) if isinstance(text, list) else str(text))
    return "".join(parts).rstrip("\n")


def target_output(outputs: list):
    """One display_data output that shows ``outputs`` as the target of a check cell.

    ``expected once your answer is right: ✓ task 1: ...`` as text/plain, and as text/markdown with
    the label in italics and the expected line in a code span (a code block when it has several
    lines), so it reads as a note about the cell, not as something the cell printed.
    """
    import nbformat

    text = _output_text(outputs)
    if "\n" in text:
        fence = "`" * max(3, 1 + max((len(m) for m in re.findall(r"`+", text)), default=0))
        markdown = f"*{TARGET_LABEL}*\n\n{fence}\n{text}\n{fence}"
        plain = f"{TARGET_LABEL}\n{text}"
    else:
        ticks = "`" * (1 + max((len(m) for m in re.findall(r"`+", text)), default=0))
        pad = " " if text.startswith("`") or text.endswith("`") else ""
        markdown = f"*{TARGET_LABEL}* {ticks}{pad}{text}{pad}{ticks}"
        plain = f"{TARGET_LABEL} {text}"
    return nbformat.v4.new_output(
        "display_data", data={"text/markdown": markdown, "text/plain": plain}
    )


def expected_outputs(cell) -> list | None:
    """The solution's outputs an exercise's check cell must reproduce (None if it has none)."""
    course = cell.get("metadata", {}).get("course", {})
    found = course.get("expected_outputs") if isinstance(course, dict) else None
    return list(found) if isinstance(found, list) else None


def _exercise_code_cell(cell: Any, new: Any, where: str, index: int) -> None:
    """``new`` (a copy of the solution's code ``cell``) with its answer stripped and its outputs
    replaced: a check cell shows a target and keeps the solution's outputs in its metadata."""
    for output in cell.get("outputs", []):
        if output.get("output_type") == "error":
            raise ExerciseError(
                f"{where}: cell index {index} has a stored error output ({output.get('ename')}); "
                f"fix the solution and execute it again: python -m course_tools.execute {where}"
            )
    new.source = strip_solution(cell.source, where=where, index=index)
    if CHECK_TAG in cell_tags(cell) and cell.get("outputs"):
        course = dict(new.metadata.get("course", {}))
        course["expected_outputs"] = copy.deepcopy(list(cell.outputs))
        new.metadata["course"] = course
        new.outputs = [target_output(cell.outputs)]
    else:
        new.outputs = []
    new.execution_count = None


def _no_markers(cell: Any, where: str, index: int) -> None:
    """Solution markers belong in code cells only."""
    for number, line in enumerate(cell.source.split("\n"), start=1):
        if _BEGIN_LINE.match(line) or _END_LINE.match(line):
            raise ExerciseError(
                f"{where}: cell index {index}, line {number}: solution marker in a {cell.cell_type} "
                "cell; markers are only allowed in code cells"
            )


def make_exercise(solution_nb, solution_path: Path | str, *, solution_rel: str | None = None):
    """The exercise notebook (a new NotebookNode) generated from one solution notebook."""
    import nbformat

    solution_path = Path(solution_path)
    where = str(solution_path)
    unit = solution_path.stem
    solution_rel = solution_rel or f"solutions/{solution_path.name}"
    solution_tasks(solution_nb, where)  # validates tags and expected outputs

    cells = [header_cell(unit)]
    used_ids = {HEADER_ID, *(cell.id for cell in grade_cells())}
    for index, cell in enumerate(solution_nb.cells):
        new = copy.deepcopy(cell)
        new.metadata = {
            k: v
            for k, v in new.get("metadata", {}).items()
            if k not in ("execution", "ExecuteTime")
        }
        cid = cell.get("id")
        if not (isinstance(cid, str) and _CELL_ID.match(cid)) or cid in used_ids:
            cid = f"cell-{index}"
        used_ids.add(cid)
        new.id = cid
        if cell.cell_type == "code":
            _exercise_code_cell(cell, new, where, index)
        else:
            _no_markers(cell, where, index)
        cells.append(new)

    cells += grade_cells(unit, solution_path.resolve().parent.parent)
    nb = nbformat.v4.new_notebook()
    nb.nbformat, nb.nbformat_minor = 4, max(5, int(solution_nb.get("nbformat_minor", 5)))
    nb.metadata = copy.deepcopy(dict(solution_nb.get("metadata", {})))
    nb.metadata.pop("widgets", None)  # the solution's widget state: no widget output survives here
    nb.metadata["course"] = {"generated_from": solution_rel, "unit": unit}
    nb.cells = cells
    return nb
