"""Grading a whole class: a folder of notebooks under any names -> one CSV, feedback files and a
summary; skipped files named in one line each; a dying kernel, or a cell that kills its grading
process, never stops the batch."""

from __future__ import annotations

import csv
import json

import nbformat

from course_lib.grade import main
from course_lib.grading.batch import collect
from course_lib.grading.grader import grade_notebook

DOUBLE_OK = "def double(x):\n    return 2 * x"
KILL_THE_WORKER = "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)"


def _class_folder(tmp_path, exercise, make_learner, solution):
    subs = tmp_path / "submissions"
    for who, name, answers, extra in [
        ("alice", "week3 final.ipynb", {"fixture-3": DOUBLE_OK, "fixture-5": "total = 45"}, None),
        ("bob", "anything.ipynb", {}, None),
        ("dave", "dies.ipynb", {"fixture-3": DOUBLE_OK}, {"fixture-4": "import os\nos._exit(1)"}),
        # a cell that kills the kernel's parent: the batch's worker process
        ("erin", "kill.ipynb", {"fixture-3": DOUBLE_OK}, {"fixture-4": KILL_THE_WORKER}),
    ]:
        learner = make_learner(exercise, answers, insert_after=extra)
        (subs / who).mkdir(parents=True, exist_ok=True)
        (subs / who / name).write_bytes(learner.read_bytes())
    (subs / "bob" / "second try.ipynb").write_bytes(exercise.read_bytes())  # same unit again
    (subs / "carol.ipynb").write_bytes(
        make_learner(exercise, {"fixture-3": DOUBLE_OK}).read_bytes()
    )
    (subs / "notes.ipynb").write_text("not a notebook")
    other = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print(1)")])
    nbformat.write(other, subs / "bob" / "other_course.ipynb")
    return subs


def test_a_class_is_graded_into_one_csv_matching_single_runs(
    tmp_path, exercise, make_learner, solution, solutions_dir, capsys
):
    subs = _class_folder(tmp_path, exercise, make_learner, solution)
    out = tmp_path / "out" / "grades.csv"
    code = main([str(subs), "--csv", str(out), "--jobs", "2", "--solutions", str(solutions_dir)])
    printed = capsys.readouterr().out
    assert code == 0
    rows = list(csv.DictReader(out.open(encoding="utf-8")))
    by = {(r["learner"], r["task"]): r for r in rows}
    graded = [r for r in rows if r["status"] not in ("unreadable", "not an exercise", "duplicate")]
    assert sorted({r["learner"] for r in graded}) == ["alice", "bob", "carol", "dave", "erin"]
    assert len(graded) == 5 * 3  # learner x task
    # every file has a row: the skipped ones score 0 with their reason
    skipped_rows = {(r["notebook"], r["status"]) for r in rows if r not in graded}
    assert skipped_rows == {
        ("bob/second try.ipynb", "duplicate"),
        ("notes.ipynb", "unreadable"),
        ("bob/other_course.ipynb", "not an exercise"),
    }
    assert all(r["points"] == "0" and r["passed"] == "False" for r in rows if r not in graded)
    assert [by["alice", t]["passed"] for t in "123"] == ["True", "True", "False"]
    assert [by["dave", t]["message"] for t in "23"] == ["kernel died", "kernel died"]
    # erin's cell killed the process that ran her kernel: only her notebook is lost
    assert {by["erin", t]["passed"] for t in "123"} == {"False"}
    assert "killed" in by["erin", "1"]["message"]
    # every row equals what grading that notebook alone gives
    for learner, rel in [("carol", "carol.ipynb"), ("alice", "alice/week3 final.ipynb")]:
        single = grade_notebook(subs / rel, solutions_dir=solutions_dir)
        for t in single.tasks:
            row = by[learner, str(t.task)]
            assert (row["passed"], row["message"], row["notebook"]) == (
                str(t.passed),
                t.message,
                rel,
            )
    # skipped files: one line each, named; the first of bob's two unit-99 notebooks is graded
    assert "bob/second try.ipynb: skipped: a second notebook of bob for unit 99_fixture" in printed
    assert "notes.ipynb: skipped: " in printed and "bob/other_course.ipynb: skipped: " in printed
    assert "graded 5 notebook(s), skipped 3" in printed and "killed" in printed
    feedback = (tmp_path / "out" / "feedback" / "alice" / "99_fixture.md").read_text()
    assert "- ✓ task 1 (1 pt): ✓ task 1: double(21) = 42" in feedback
    assert (tmp_path / "out" / "feedback" / "dave" / "99_fixture.md").read_text().count("✗") == 2


def test_bad_folders_are_one_line_and_exit_2(tmp_path, capsys):
    assert main([str(tmp_path / "missing"), "--csv", str(tmp_path / "g.csv")]) == 2
    assert capsys.readouterr().err.strip().endswith("no such folder")
    (tmp_path / "empty").mkdir()
    assert main([str(tmp_path / "empty"), "--csv", str(tmp_path / "g.csv")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"grade: error: submissions = {str(tmp_path / 'empty')!r}: no notebooks (*.ipynb) under it"
    ]
    assert main([str(tmp_path / "empty"), "--jobs", "0"]) == 2
    assert "jobs = 0: expected" in capsys.readouterr().err


def test_collect_matches_units_by_metadata_not_name(tmp_path, exercise, solutions_dir):
    (tmp_path / "subs" / "x").mkdir(parents=True)
    data = json.loads(exercise.read_text())
    (tmp_path / "subs" / "x" / "homework.ipynb").write_text(json.dumps(data))
    found, skipped, ungraded = collect(tmp_path / "subs", solutions_dir)
    assert [(s.learner, s.unit) for s in found] == [("x", "99_fixture")] and skipped == []
    assert ungraded == []


def test_good_empty_broken_and_killing_notebooks_each_get_a_row_and_a_line(
    tmp_path, exercise, make_learner, solutions_dir, capsys
):
    subs = tmp_path / "subs"
    subs.mkdir()
    (subs / "good.ipynb").write_bytes(make_learner(exercise, {"fixture-3": DOUBLE_OK}).read_bytes())
    (subs / "99_empty.ipynb").write_bytes(b"")
    (subs / "99_broken.ipynb").write_text('{"cells": [', encoding="utf-8")
    killer = make_learner(
        exercise, {"fixture-3": DOUBLE_OK}, insert_after={"fixture-4": KILL_THE_WORKER}
    )
    (subs / "killer.ipynb").write_bytes(killer.read_bytes())
    out = tmp_path / "grades.csv"
    code = main([str(subs), "--csv", str(out), "--jobs", "2", "--solutions", str(solutions_dir)])
    printed = capsys.readouterr().out
    assert code == 0
    rows = list(csv.DictReader(out.open(encoding="utf-8")))
    learners = {r["learner"] for r in rows}
    assert learners == {"good", "99_empty", "99_broken", "killer"}, rows
    # the unreadable files are matched to unit 99 by their names: a 0-point row per task
    for who in ("99_empty", "99_broken"):
        mine = [r for r in rows if r["learner"] == who]
        assert [r["task"] for r in mine] == ["1", "2", "3"] and {r["status"] for r in mine} == {
            "unreadable"
        }
    assert [r["passed"] for r in rows if r["learner"] == "good"] == ["True", "False", "False"]
    assert {r["passed"] for r in rows if r["learner"] == "killer"} == {"False"}
    for name in ("good", "killer"):
        assert any(line.startswith(name) for line in printed.splitlines()), printed
    for name in ("99_empty.ipynb: skipped", "99_broken.ipynb: skipped"):
        assert name in printed, printed
