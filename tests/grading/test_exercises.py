"""Exercise generator: hints, kept check outputs, canonical bytes, malformed markers, staleness
(one exercise: course_lib.grading.exercises; the folder: course_tools.exercises)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import nbformat
import pytest

from course_lib.grading.exercises import (
    ExerciseError,
    make_exercise,
    reset_exercise,
    solution_tasks,
    strip_solution,
)
from course_tools.exercises import build_exercises, check_exercises, main


def _cells(path):
    return {cell.id: cell for cell in nbformat.read(path, as_version=4).cells}


def test_markers_become_hints_at_their_indentation(exercise, solution):
    cells = _cells(exercise)
    # function body: indented markers, a comment and a blank line that do not count
    assert cells["fixture-3"].source == (
        'def double(x):\n    """Return twice x."""\n    raise NotImplementedError("FILL ME IN (roughly 2 lines)")'
    )
    # top level, singular "line", the code after the region stays
    assert (
        cells["fixture-5"].source
        == 'raise NotImplementedError("FILL ME IN (roughly 1 line)")\ntotal'
    )
    assert (
        cells["fixture-7"].source
        == 'def mean(xs):\n    raise NotImplementedError("FILL ME IN (roughly 1 line)")'
    )
    text = exercise.read_text(encoding="utf-8")
    for answer in (
        "BEGIN SOLUTION",
        "END SOLUTION",
        "2 * x",
        "9 * 10 // 2",
        "sum(xs) / len(xs)",
    ):
        assert answer not in text


def test_check_cells_show_a_target_and_keep_the_expected_output_in_metadata(exercise, solution):
    cells, ref = _cells(exercise), _cells(solution)
    kept = {"fixture-4", "fixture-6", "fixture-8", "fixture-9"}  # tagged NBVAL_CHECK_OUTPUT
    for cell_id, cell in cells.items():
        if cell.cell_type != "code":
            continue
        # nothing looks run: no execution count anywhere, so no "[4]:" beside an unfilled check
        assert cell.execution_count is None, cell_id
        if cell_id in kept:
            assert (
                ref[cell_id].outputs
                and cell.metadata["course"]["expected_outputs"] == ref[cell_id].outputs
            )
            (shown,) = cell.outputs
            assert shown.output_type == "display_data"
            line = "".join("".join(o["text"]) for o in ref[cell_id].outputs).rstrip("\n")
            assert shown.data["text/plain"] == f"expected once your answer is right: {line}"
            assert shown.data["text/markdown"] == f"*expected once your answer is right:* `{line}`"
        else:
            assert cell.outputs == [] and "course" not in cell.metadata, cell_id
    assert ref["fixture-2"].outputs and ref["fixture-5"].outputs  # they had outputs to clear


def test_target_output_quotes_backticks_and_several_lines():
    from course_lib.grading.exercises import target_output

    one = target_output(
        [{"output_type": "stream", "name": "stdout", "text": "✓ task 1: `x` = 2\n"}]
    )
    assert (
        one.data["text/markdown"] == "*expected once your answer is right:* ``✓ task 1: `x` = 2``"
    )
    two = target_output(
        [
            {"output_type": "stream", "name": "stdout", "text": "a\nb\n"},
            {
                "output_type": "execute_result",
                "data": {"text/plain": "3"},
                "metadata": {},
                "execution_count": 1,
            },
        ]
    )
    assert two.data["text/plain"] == "expected once your answer is right:\na\nb\n3"
    assert two.data["text/markdown"].endswith("\n\n```\na\nb\n3\n```")


def test_header_metadata_and_ids(exercise):
    nb = nbformat.read(exercise, as_version=4)
    nbformat.validate(nb)
    header = nb.cells[0]
    assert header.cell_type == "markdown" and header.id == "generated-header"
    # for the learner: how to grade from JupyterLab (the last cell, or one line in its terminal,
    # whose python is the course's under make lab) and how to start over; where the file comes
    # from is for maintainers and stays in the metadata
    assert "run the last cell, *Grade this notebook*" in header.source
    assert "`python -m course_lib.grade exercises/99_fixture.ipynb`" in header.source
    assert "`python -m course_lib.grading.exercises reset 99`" in header.source
    assert "solutions/" not in header.source and "make exercises" not in header.source
    assert nb.metadata["course"] == {
        "generated_from": "solutions/99_fixture.ipynb",
        "unit": "99_fixture",
    }
    assert [c.id for c in nb.cells[1:-2]] == [f"fixture-{i}" for i in range(11)]
    title, grade = nb.cells[-2:]
    assert title.source.startswith("## Grade this notebook") and grade.cell_type == "code"
    assert grade.id == "grade-here" and "grade_here()" in grade.source and grade.outputs == []


def test_reset_restores_the_generated_exercise_and_keeps_a_backup(exercise, solutions_dir):
    from course_lib.grading.exercises import main

    pristine = exercise.read_bytes()
    exercise.write_text(exercise.read_text().replace("FILL ME IN", "my answer"))
    mine = exercise.read_bytes()
    args = ["reset", "99", "--solutions", str(solutions_dir), "--out", str(exercise.parent)]
    assert main(args) == 0
    assert exercise.read_bytes() == pristine
    (backup,) = (exercise.parent / "backups").glob("99_fixture-*.ipynb")
    assert backup.read_bytes() == mine
    assert check_exercises(solutions_dir, exercise.parent) == []  # the backup is no exercise
    with pytest.raises(ExerciseError, match=r"unit = '42': expected one of 99"):
        reset_exercise("42", solutions_dir, exercise.parent)


def test_build_is_byte_identical_and_canonical(exercise, solutions_dir, tmp_path):
    first = exercise.read_bytes()
    (again,) = build_exercises(solutions_dir, tmp_path / "again")
    assert again.read_bytes() == first
    assert first.endswith(b"}\n")
    data = json.loads(first)
    assert (
        first.decode("utf-8")
        == json.dumps(data, sort_keys=True, indent=1, ensure_ascii=False) + "\n"
    )


SOLUTION_CELL = (
    "def f(x):\n    ### BEGIN SOLUTION\n    y = x + 1\n    return y\n    ### END SOLUTION\n"
)


@pytest.mark.parametrize(
    ("source", "match"),
    [
        (
            "def f(x):\n    ### BEGIN SOLUTION\n    return x\n",
            r"cell index 4, line 2: '### BEGIN SOLUTION' without a matching",
        ),
        (
            "### BEGIN SOLUTION\nx = 1\n### BEGIN SOLUTION\ny = 2\n### END SOLUTION",
            r"cell index 4, line 3: nested",
        ),
        (
            "x = 1\n### END SOLUTION",
            r"cell index 4, line 2: '### END SOLUTION' without a '### BEGIN SOLUTION'",
        ),
        (
            "### BEGIN SOLUTION\n# only a comment\n\n### END SOLUTION",
            r"cell index 4, line 1: empty solution region",
        ),
        ("x = 1  # BEGIN SOLUTION", r"cell index 4, line 1: malformed marker"),
    ],
)
def test_malformed_markers_name_file_cell_and_line(source, match):
    with pytest.raises(ExerciseError, match=r"^solutions/42_x\.ipynb: " + match):
        strip_solution(source, where="solutions/42_x.ipynb", index=4)


def test_strip_solution_counts_answer_lines():
    assert strip_solution(SOLUTION_CELL, where="s", index=0) == (
        'def f(x):\n    raise NotImplementedError("FILL ME IN (roughly 2 lines)")\n'
    )


def _solution_with(cell):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1"), cell])
    return nb


def test_malformed_solutions_are_rejected(tmp_path):
    error_cell = nbformat.v4.new_code_cell("1 / 0", execution_count=2)
    error_cell.outputs = [
        nbformat.v4.new_output(
            "error", ename="ZeroDivisionError", evalue="division by zero", traceback=[]
        )
    ]
    with pytest.raises(
        ExerciseError,
        match=r"42_x\.ipynb: cell index 1 has a stored error output \(ZeroDivisionError\)",
    ):
        make_exercise(_solution_with(error_cell), tmp_path / "42_x.ipynb")

    unrun_check = nbformat.v4.new_code_cell(
        "check()", metadata={"tags": ["NBVAL_CHECK_OUTPUT", "task-1"]}
    )
    with pytest.raises(ExerciseError, match=r"check cell index 1 \(task-1\) has no stored output"):
        make_exercise(_solution_with(unrun_check), tmp_path / "42_x.ipynb")

    untagged = nbformat.v4.new_code_cell("check()", metadata={"tags": ["task-1"]})
    with pytest.raises(ExerciseError, match="has tag task-1 but not NBVAL_CHECK_OUTPUT"):
        make_exercise(_solution_with(untagged), tmp_path / "42_x.ipynb")

    markdown = nbformat.v4.new_markdown_cell("### BEGIN SOLUTION\nanswer\n### END SOLUTION")
    with pytest.raises(
        ExerciseError, match="cell index 1, line 1: solution marker in a markdown cell"
    ):
        make_exercise(_solution_with(markdown), tmp_path / "42_x.ipynb")


def test_check_detects_stale_missing_and_extra(exercise, solutions_dir, tmp_path):
    out = exercise.parent
    assert check_exercises(solutions_dir, out) == []

    nb = nbformat.read(exercise, as_version=4)
    nb.cells[4].source = "def double(x):\n    return 2 * x"  # an edit by hand
    nbformat.write(nb, exercise)
    (extra := out / "07_orphan.ipynb").write_text("{}", encoding="utf-8")
    problems = check_exercises(solutions_dir, out)
    assert len(problems) == 2
    assert problems[0].startswith(f"stale: {exercise}")
    assert problems[1].startswith(f"extra: {extra}")

    exercise.unlink()
    assert check_exercises(solutions_dir, out)[0] == f"missing: {exercise} (run make exercises)"

    build_exercises(
        solutions_dir, out
    )  # rewrites the missing file, leaves the hand-made extra file
    assert check_exercises(solutions_dir, out) == [
        f"extra: {extra} has no solution {solutions_dir / extra.name}; delete it"
    ]


def test_build_removes_orphaned_generated_files(exercise, solutions_dir, tmp_path):
    solutions = tmp_path / "solutions"
    shutil.copytree(solutions_dir, solutions)
    out = exercise.parent
    shutil.copy(solutions / "99_fixture.ipynb", solutions / "98_gone.ipynb")
    build_exercises(solutions, out)
    assert (out / "98_gone.ipynb").exists()
    (solutions / "98_gone.ipynb").unlink()
    assert build_exercises(solutions, out) == [exercise]
    assert not (out / "98_gone.ipynb").exists()


def test_cli_build_check_and_errors(solutions_dir, tmp_path, capsys):
    out = tmp_path / "exercises"
    assert main(["check", "--solutions", str(solutions_dir), "--out", str(out)]) == 1
    assert "missing:" in capsys.readouterr().err
    assert main(["build", "--solutions", str(solutions_dir), "--out", str(out)]) == 0
    assert main(["check", "--solutions", str(solutions_dir), "--out", str(out)]) == 0

    bad = tmp_path / "bad"
    bad.mkdir()
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("### BEGIN SOLUTION\nx = 1")])
    nbformat.write(nb, bad / "05_bad.ipynb")
    capsys.readouterr()
    assert main(["build", "--solutions", str(bad), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "05_bad.ipynb: cell index 0, line 1" in err
    assert not (tmp_path / "o").exists()  # validated before anything is written


@pytest.mark.slow
def test_cli_runs_as_module(solutions_dir, tmp_path):
    cmd = [
        sys.executable,
        "-m",
        "course_tools.exercises",
        "build",
        "--solutions",
        str(solutions_dir),
        "--out",
        str(tmp_path / "e"),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "e" / "99_fixture.ipynb").exists()


def test_old_notebooks_without_cell_ids_get_deterministic_ids(solution, tmp_path):
    nb = nbformat.read(solution, as_version=4)
    nb.nbformat_minor = 4
    for cell in nb.cells:
        del cell["id"]
    solutions = tmp_path / "solutions"
    solutions.mkdir()
    nbformat.write(nb, solutions / "99_fixture.ipynb")
    (path,) = build_exercises(solutions, tmp_path / "a")
    (again,) = build_exercises(solutions, tmp_path / "b")
    assert path.read_bytes() == again.read_bytes()
    ids = [c.id for c in nbformat.read(path, as_version=4).cells]
    assert ids == ["generated-header"] + [f"cell-{i}" for i in range(11)] + [
        "grade-here-title",
        "grade-here",
    ]


@pytest.mark.parametrize(
    ("tags", "match"),
    [
        (
            ["NBVAL_CHECK_OUTPUT", "task-x"],
            "tag 'task-x'; task tags are task-N with N a whole number",
        ),
        (["NBVAL_CHECK_OUTPUT", "task-1", "task-2"], "has several task tags"),
        (
            ["NBVAL_CHECK_OUTPUT", "task-1", "points-0"],
            r"points tags \['0'\]; use one points-P with P > 0",
        ),
    ],
)
def test_bad_task_and_points_tags(tags, match):
    cell = nbformat.v4.new_code_cell("check()", metadata={"tags": tags}, execution_count=1)
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="✓ task 1: ok\n")]
    with pytest.raises(ExerciseError, match=r"^solutions/42_x\.ipynb: cell index 1 .*" + match):
        solution_tasks(_solution_with(cell), "solutions/42_x.ipynb")


def test_duplicate_task_and_points(solution):
    cell = nbformat.v4.new_code_cell(
        "check()",
        metadata={"tags": ["NBVAL_CHECK_OUTPUT", "task-1", "points-2.5"]},
        execution_count=1,
    )
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="✓ task 1: ok\n")]
    nb = _solution_with(cell)
    assert solution_tasks(nb, "s")[1].points == 2.5
    nb.cells.append(cell)
    with pytest.raises(ExerciseError, match=r"task-1 tags two cells \(index 1 and 2\)"):
        solution_tasks(nb, "s")
    tasks = solution_tasks(nbformat.read(solution, as_version=4), solution)
    assert [(t.task, t.points, t.cell_index) for t in tasks.values()] == [
        (1, 1, 4),
        (2, 2, 6),
        (3, 1, 8),
    ]
