"""Generate ``exercises/`` from ``solutions/`` (the source of truth) and detect drift.

    python -m course_lib.grading.exercises build [--solutions solutions --out exercises]
    python -m course_lib.grading.exercises check [--solutions solutions --out exercises]
    python -m course_lib.grading.exercises reset NN   # start unit NN's exercise over (a backup kept)

For each ``solutions/NN_topic.ipynb`` the generator writes ``exercises/NN_topic.ipynb`` where

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
  through the pytest plugin :mod:`course_lib.grading.nbval_targets` (loaded by the repository's
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
import copy
import json
import re
import sys
from pathlib import Path
from typing import Any

from course_lib.grading.exercise_cells import (
    GRADE_CELL_ID,
    HEADER_ID,
    grade_cells,
    header_cell,
    reset_exercise,
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
    "build_exercises",
    "check_exercises",
    "expected_outputs",
    "make_exercise",
    "reset_exercise",
    "load_notebook_json",
    "read_notebook",
    "render_notebook",
    "target_output",
    "solution_tasks",
    "unit_names",
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
                f"fix the solution and execute it again: python -m course_lib.grading.execute {where}"
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


# --------------------------------------------------------------------------- build / check
def _expected_files(solutions_dir: Path, out_dir: Path) -> dict[Path, str]:
    if not solutions_dir.is_dir():
        raise ExerciseError(f"{solutions_dir}: no such solutions directory")
    expected: dict[Path, str] = {}
    for unit in unit_names(solutions_dir):
        path = solutions_dir / f"{unit}.ipynb"
        nb = read_notebook(path)
        expected[out_dir / path.name] = render_notebook(
            make_exercise(nb, path, solution_rel=f"solutions/{path.name}")
        )
    return expected


def _is_generated(path: Path) -> bool:
    try:
        meta = json.loads(path.read_text(encoding="utf-8")).get("metadata", {})
        return isinstance(meta.get("course"), dict) and "generated_from" in meta["course"]
    except (OSError, ValueError, AttributeError):
        return False


def build_exercises(
    solutions_dir: Path | str = "solutions", out_dir: Path | str = "exercises"
) -> list[Path]:
    """Write ``out_dir/NN_topic.ipynb`` for every ``solutions_dir/NN_topic.ipynb``; return the paths.

    Files are only rewritten when their bytes change. Exercise notebooks that this generator wrote
    earlier (metadata ``course.generated_from``) whose solution no longer exists are deleted; other
    files in ``out_dir`` are left alone (``check_exercises`` reports them). Everything is validated
    before anything is written.
    """
    solutions_dir, out_dir = Path(solutions_dir), Path(out_dir)
    expected = _expected_files(solutions_dir, out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for path, text in expected.items():
        data = text.encode("utf-8")
        if not path.exists() or path.read_bytes() != data:
            path.write_bytes(data)
    for path in sorted(out_dir.glob("*.ipynb")):
        if path not in expected and _is_generated(path):
            path.unlink()
    return sorted(expected)


def check_exercises(
    solutions_dir: Path | str = "solutions", out_dir: Path | str = "exercises"
) -> list[str]:
    """Problems (one line each) if ``out_dir`` differs from what :func:`build_exercises` writes; [] if in sync."""
    solutions_dir, out_dir = Path(solutions_dir), Path(out_dir)
    expected = _expected_files(solutions_dir, out_dir)
    problems = []
    for path, text in expected.items():
        if not path.exists():
            problems.append(f"missing: {path} (run make exercises)")
        elif path.read_bytes() != text.encode("utf-8"):
            problems.append(
                f"stale: {path} differs from what make exercises writes from {solutions_dir / path.name} "
                "(edited by hand, or the solution changed); run make exercises"
            )
    if out_dir.is_dir():
        for path in sorted(out_dir.glob("*.ipynb")):
            if path not in expected:
                problems.append(
                    f"extra: {path} has no solution {solutions_dir / path.name}; delete it"
                )
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m course_lib.grading.exercises",
        description="Generate exercises/ from solutions/ (build), check that they are in sync "
        "(check), or start one exercise over (reset NN: the learner's file is kept as a backup).",
    )
    parser.add_argument("command", choices=["build", "check", "reset"])
    parser.add_argument("unit", nargs="?", help="reset: the unit's number, e.g. 03")
    parser.add_argument(
        "--solutions", default="solutions", help="solutions directory (default: solutions)"
    )
    parser.add_argument(
        "--out", default="exercises", help="exercises directory (default: exercises)"
    )
    args = parser.parse_args(argv)
    if args.command == "reset":
        return _reset(args)
    try:
        if args.command == "build":
            for path in build_exercises(args.solutions, args.out):
                print(path)
            return 0
        problems = check_exercises(args.solutions, args.out)
    except ExerciseError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        print(
            f"{len(problems)} problem(s): {args.out}/ is out of sync with {args.solutions}/",
            file=sys.stderr,
        )
        return 1
    print(f"{args.out}/ is in sync with {args.solutions}/")
    return 0


def _reset(args: argparse.Namespace) -> int:
    """``reset NN``: the pristine exercise back in place; says where the learner's file went."""
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
