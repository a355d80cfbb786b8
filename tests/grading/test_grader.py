"""Grader: full marks on the solution, 0 on the exercise, partial credit, nbval-style output
comparison, kernel death and timeouts never pass, bad input exits 2 with one line."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import nbformat
import psutil
import pytest

from course_lib.grade import main
from course_lib.grading.grader import (
    GradingInputError,
    TaskResult,
    coalesce_streams,
    compare_outputs,
    find_solution,
    grade_notebook,
)
from course_lib.grading.sandbox import unavailable_reason

DOUBLE_OK = "def double(x):\n    return 2 * x"
CHECK_LINES = {
    1: "✓ task 1: double(21) = 42",
    2: "✓ task 2: total = 45",
    3: "✓ task 3: mean([1, 2, 4]) matches the reference within rtol=1e-09, atol=0",
}


def _children() -> list:
    """Child processes of this test process, less the launcher's long-lived helpers (the warm
    forkserver and resource tracker that other tests in the same session may have started)."""
    from course_lib.runtime.launch import helper_pids

    helpers = helper_pids()
    return [
        p
        for p in psutil.Process().children(recursive=True)
        if p.pid not in helpers and not (helpers & {a.pid for a in p.parents()})
    ]


def test_solution_gets_full_marks_json(solution, solutions_dir, capsys):
    before = solution.read_bytes()
    assert main([str(solution), "--solutions", str(solutions_dir), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["score"] == report["total"] == 4 and report["status"] == "completed"
    assert [(t["task"], t["points"], t["passed"], t["message"]) for t in report["tasks"]] == [
        (1, 1, True, CHECK_LINES[1]),
        (2, 2, True, CHECK_LINES[2]),
        (3, 1, True, CHECK_LINES[3]),
    ]
    assert solution.read_bytes() == before  # grading never writes the notebook


def test_untouched_exercise_fails_every_task(exercise, solutions_dir, capsys):
    assert main([str(exercise), "--solutions", str(solutions_dir)]) == 1
    out = capsys.readouterr().out
    assert "✗ task 1: not implemented yet: double raised NotImplementedError" in out
    assert "NameError: name 'total' is not defined" in out
    assert "✗ task 3: not implemented yet: mean raised NotImplementedError" in out
    assert "cell 7: NotImplementedError: FILL ME IN (roughly 1 line)" in out  # Cell 7 in the lab
    assert out.rstrip().endswith("score: 0/4 points")


def test_one_task_fixed_gets_partial_marks(exercise, solutions_dir, make_learner):
    learner = make_learner(exercise, {"fixture-3": DOUBLE_OK})
    report = grade_notebook(
        learner, solutions_dir=solutions_dir
    )  # found through metadata course.unit
    assert report.tasks[0] == TaskResult(1, 1, True, CHECK_LINES[1])
    assert [t.passed for t in report.tasks] == [True, False, False]
    assert (report.score, report.total) == (1, 4)
    assert report.solution == solutions_dir / "99_fixture.ipynb"


def test_only_the_check_decides_and_an_edited_check_does_not_count(
    exercise, solutions_dir, make_learner
):
    learner = make_learner(
        exercise,
        {
            # the learner's own output is theirs: debugging prints do not fail a task
            "fixture-3": 'def double(x):\n    print("debug:", x)\n    return 2 * x',
            "fixture-5": "total = 45",
            # an edited check cell does not count: the solution's check code runs instead
            "fixture-8": f'print("{CHECK_LINES[3]}")',
        },
    )
    report = grade_notebook(learner, solutions_dir=solutions_dir)
    task1, task2, task3 = report.tasks
    assert task1 == TaskResult(1, 1, True, CHECK_LINES[1])
    assert task2 == TaskResult(2, 2, True, CHECK_LINES[2])
    assert task3 == TaskResult(
        3, 1, False, "✗ task 3: not implemented yet: mean raised NotImplementedError", "edited"
    )
    assert report.score == 3
    # ...and the edit is named (tamper evidence), in the table and the JSON
    assert report.tampered == ["the check cell of task 3 was edited; graded with the original"]
    assert (task1.tampered, task2.tampered) == ("", "")
    assert report.to_dict()["tampered"] == report.tampered
    assert "check cells changed in the notebook:" in report.format_table()


def test_a_value_computed_by_a_statement_is_not_carried(exercise, solutions_dir, make_learner):
    # only definitions travel to the clean process: a literal constant does, a computed one not
    learner = make_learner(exercise, {"fixture-5": "total = sum(range(10))"})
    task2 = grade_notebook(learner, solutions_dir=solutions_dir).tasks[1]
    assert not task2.passed and "name 'total' is not defined" in task2.message


def test_moved_deleted_and_added_check_cells_are_named(exercise, solutions_dir, capsys):
    nb = nbformat.read(exercise, as_version=4)
    by_id = {cell.id: cell for cell in nb.cells}
    copy = nbformat.v4.new_code_cell(
        by_id["fixture-4"].source, metadata=by_id["fixture-4"].metadata
    )
    copy.id = "added-copy"
    cells = [c for c in nb.cells if c.id not in ("fixture-6", "fixture-8")]  # task 3's deleted
    at = next(i for i, c in enumerate(cells) if c.id == "fixture-5")
    cells.insert(at, by_id["fixture-6"])  # task 2's check moved above the cell it checks
    cells.insert(at, copy)  # a second check cell for task 1
    nb.cells = cells
    learner = exercise.parent / "tampered_99_fixture.ipynb"
    nbformat.write(nb, learner)
    assert main([str(learner), "--solutions", str(solutions_dir), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["tampered"] == [
        "a second check cell for task 1 was added; the first is graded, with the original",
        "the check cell of task 2 was moved; graded where it now stands",
        "the check cell of task 3 was deleted; the task scores 0",
    ]
    assert [t["tampered"] for t in report["tasks"]] == ["added", "moved", "deleted"]
    assert report["score"] == 0


def test_untouched_notebooks_show_no_tampering(solution, exercise, solutions_dir):
    from course_lib.grading.grader import _load
    from course_lib.grading.tamper import check_cell_changes

    for path in (solution, exercise):
        nb, _, expected, solution_nb = _load(path, solutions_dir)
        ids = [cell.get("id") for cell in solution_nb.cells]
        assert check_cell_changes(nb, expected, ids) == {}


@pytest.mark.parametrize(
    "death", ["import os\nos._exit(1)", "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)"]
)
def test_kernel_death_scores_zero_for_remaining_tasks(exercise, solutions_dir, make_learner, death):
    learner = make_learner(
        exercise,
        {"fixture-3": DOUBLE_OK, "fixture-5": "total = 45"},
        insert_after={"fixture-4": death},
    )
    report = grade_notebook(learner, solutions_dir=solutions_dir, timeout=60)
    assert report.status == "kernel died"
    assert report.tasks == [
        TaskResult(1, 1, True, CHECK_LINES[1]),
        TaskResult(2, 2, False, "kernel died"),
        TaskResult(3, 1, False, "kernel died"),
    ]
    assert _children() == []  # nothing outlives the grading


@pytest.mark.parametrize("isolation", ["none", "required"])
def test_processes_an_answer_starts_in_their_own_session_do_not_outlive_grading(
    exercise, solutions_dir, make_learner, isolation
):
    if isolation == "required" and unavailable_reason() is not None:
        pytest.skip(f"no sandbox: {unavailable_reason()}")
    marker = f"escaped-{uuid.uuid4().hex}"
    escape = (
        "import subprocess, sys\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)', "
        f"{marker!r}],\n"
        "                     start_new_session=True, stdout=subprocess.DEVNULL)\n"
    )
    learner = make_learner(exercise, {"fixture-3": DOUBLE_OK}, insert_after={"fixture-4": escape})
    report = grade_notebook(learner, solutions_dir=solutions_dir, timeout=60, isolation=isolation)
    assert report.status == "completed" and report.tasks[0].passed, report
    left = []
    for proc in psutil.process_iter(["cmdline"]):
        if marker in (proc.info["cmdline"] or []) and proc.status() != psutil.STATUS_ZOMBIE:
            left.append(proc)
            proc.kill()
    assert not left, "a process the answer started in its own session outlived grading"
    assert _children() == []


def test_cell_timeout_scores_zero_for_remaining_tasks(
    exercise, solutions_dir, make_learner, capsys
):
    learner = make_learner(
        exercise,
        {"fixture-3": DOUBLE_OK},
        insert_after={"fixture-4": "import time\ntime.sleep(60)"},
    )
    assert main([str(learner), "--solutions", str(solutions_dir), "--timeout", "2", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["status"] == "cell timed out after 2 s"
    assert [(t["passed"], t["message"]) for t in report["tasks"]] == [
        (True, CHECK_LINES[1]),
        (False, "cell timed out after 2 s"),
        (False, "cell timed out after 2 s"),
    ]
    assert report["score"] == 1
    assert _children() == []  # the busy kernel was killed


def _write(path, text):
    path.write_text(text, encoding="utf-8")
    return path


def _bad_inputs(tmp_path):
    other = nbformat.v4.new_notebook(metadata={"course": {"unit": "42_nope"}})
    nbformat.write(other, tmp_path / "mine.ipynb")
    return {
        "missing": (tmp_path / "absent.ipynb", "absent.ipynb: no such file"),
        "invalid json": (
            _write(tmp_path / "broken.ipynb", "{not json"),
            "broken.ipynb: not a Jupyter notebook (invalid JSON",
        ),
        "not a notebook": (
            _write(tmp_path / "data.ipynb", '{"a": 1}'),
            "data.ipynb: not a Jupyter notebook (no 'cells' list",
        ),
        "no solution": (
            tmp_path / "mine.ipynb",
            "mine.ipynb: no matching solution for '42_nope' (from its metadata course.unit='42_nope'); known units in",
        ),
    }


@pytest.mark.parametrize("case", ["missing", "invalid json", "not a notebook", "no solution"])
def test_bad_input_exits_2_with_one_line(tmp_path, solutions_dir, case):
    path, expected = _bad_inputs(tmp_path)[case]
    cmd = [sys.executable, "-m", "course_lib.grade", str(path), "--solutions", str(solutions_dir)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("grade: error: ") and expected in done.stderr
    if case == "no solution":
        assert done.stderr.rstrip().endswith(": 99_fixture")  # the valid choices


def test_bad_timeout_and_missing_solutions_dir(solution, tmp_path):
    with pytest.raises(
        GradingInputError, match="timeout must be a positive number of seconds, got 0"
    ):
        grade_notebook(solution, timeout=0)
    with pytest.raises(GradingInputError, match="no solutions directory at"):
        grade_notebook(solution, solutions_dir=tmp_path / "nowhere")


def test_find_solution_by_metadata_file_name_and_prefix(tmp_path, solutions_dir):
    plain = nbformat.v4.new_notebook()
    expected = solutions_dir / "99_fixture.ipynb"
    assert find_solution(tmp_path / "99_fixture.ipynb", plain, solutions_dir) == expected
    assert find_solution(tmp_path / "99_fixture-Copy1.ipynb", plain, solutions_dir) == expected
    generated = nbformat.v4.new_notebook(
        metadata={"course": {"generated_from": "solutions/99_fixture.ipynb"}}
    )
    assert find_solution(tmp_path / "anything.ipynb", generated, solutions_dir) == expected
    with pytest.raises(
        GradingInputError, match=r"no matching solution for 'homework' \(from its file name\)"
    ):
        find_solution(tmp_path / "homework.ipynb", plain, solutions_dir)


def _stream(text, name="stdout"):
    return nbformat.v4.new_output("stream", name=name, text=text)


def test_compare_outputs_nbval_semantics():
    expected = [_stream("✓ task 1: x = 3\n")]
    assert (
        compare_outputs([_stream("✓ task 1: x = 3   \n\n")], expected) is None
    )  # trailing whitespace
    assert (
        compare_outputs([_stream("✓ task 1: "), _stream("x = 3\n")], expected) is None
    )  # merged streams
    assert compare_outputs([_stream("50%\r✓ task 1: x = 3\n")], expected) is None  # \r progress
    result = nbformat.v4.new_output(
        "execute_result", data={"text/plain": "3", "image/png": "aGk="}, execution_count=9
    )
    assert (
        compare_outputs(
            [result],
            [nbformat.v4.new_output("execute_result", data={"text/plain": "3"}, execution_count=1)],
        )
        is None
    )
    assert (
        compare_outputs([], expected)
        == "output differs: expected stdout '✓ task 1: x = 3', got no stdout output"
    )
    assert (
        compare_outputs(expected + [_stream("warning\n", "stderr")], expected)
        == "output differs: unexpected stderr output 'warning'"
    )
    assert compare_outputs([_stream("✓ task 1: x = 4\n")], expected) == (
        "output differs (stdout, line 1): expected '✓ task 1: x = 3', got '✓ task 1: x = 4'"
    )


def test_coalesce_streams_matches_nbval():
    plugin = pytest.importorskip("nbval.plugin")
    outputs = [_stream("a\rb\n"), _stream("x\b\by"), _stream("err", "stderr"), _stream("c\rd")]
    ours = [(o["name"], o["text"]) for o in coalesce_streams(outputs)]
    theirs = [
        (o.name, o.text)
        for o in plugin.coalesce_streams([nbformat.from_dict(dict(o)) for o in outputs])
    ]
    assert ours == theirs


def test_missing_kernel_scores_zero_not_a_traceback(solution, solutions_dir):
    report = grade_notebook(solution, solutions_dir=solutions_dir, kernel_name="no-such-kernel")
    assert report.score == 0 and not any(t.passed for t in report.tasks)
    assert report.status.startswith("kernel 'no-such-kernel' failed to start: NoSuchKernel")
    assert {t.message for t in report.tasks} == {report.status}


def test_a_helper_and_a_constant_in_other_cells_still_count(exercise, solutions_dir, make_learner):
    learner = make_learner(
        exercise,
        {"fixture-3": "def double(x):\n    return _times(x, FACTOR)"},
        insert_after={"fixture-1": "FACTOR = 2\n\ndef _times(x, k):\n    return k * x"},
    )
    report = grade_notebook(learner, solutions_dir=solutions_dir)
    assert report.tasks[0] == TaskResult(1, 1, True, CHECK_LINES[1])
