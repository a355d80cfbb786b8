"""The grade's isolation choices: bad input is one line and exit 2; without a sandbox the report
says, in its table, its JSON and the CSV, that the grade is a self-check."""

from __future__ import annotations

import csv
import json

import pytest

from course_lib.grade import main
from course_lib.grading import sandbox
from course_lib.grading.absent import stub_source
from course_lib.grading.grader import GradingInputError, grade_notebook

DOUBLE_OK = "def double(x):\n    return 2 * x"


def test_an_unknown_isolation_is_one_line_and_exit_2(solution, capsys):
    assert main([str(solution), "--isolation", "docker"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["grade: error: --isolation 'docker': expected one of auto, required, none"]
    with pytest.raises(GradingInputError, match="isolation = 'docker': expected one of auto"):
        grade_notebook(solution, isolation="docker")


def test_required_without_a_sandbox_tool_is_one_line_and_exit_2(
    solution, solutions_dir, monkeypatch, capsys, tmp_path
):
    monkeypatch.setattr(sandbox, "bwrap_path", lambda: None)
    sandbox._probe.cache_clear()
    try:
        code = main([str(solution), "--solutions", str(solutions_dir), "--isolation", "required"])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1, err
        assert err[0].startswith("grade: error: isolation = 'required', but no bubblewrap")
        folder = tmp_path / "subs"
        folder.mkdir()
        (folder / "a.ipynb").write_bytes(solution.read_bytes())
        assert (
            main([str(folder), "--isolation", "required", "--solutions", str(solutions_dir)]) == 2
        )
        assert "isolation = 'required', but no bubblewrap" in capsys.readouterr().err
    finally:
        sandbox._probe.cache_clear()


def test_without_a_sandbox_the_grade_says_it_is_a_self_check(
    exercise, solutions_dir, make_learner, tmp_path, capsys
):
    learner = make_learner(exercise, {"fixture-3": DOUBLE_OK})
    assert main([str(learner), "--solutions", str(solutions_dir), "--isolation", "none"]) == 1
    table = capsys.readouterr().out
    assert "isolation: none - a self-check" in table
    main([str(learner), "--solutions", str(solutions_dir), "--isolation", "none", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert report["isolation"] == "none" and report["tasks"][0]["passed"]
    folder = tmp_path / "subs"
    folder.mkdir()
    (folder / "a.ipynb").write_bytes(learner.read_bytes())
    out = tmp_path / "g.csv"
    args = [
        str(folder),
        "--csv",
        str(out),
        "--isolation",
        "none",
        "--solutions",
        str(solutions_dir),
    ]
    assert main(args) == 0
    assert "isolation: none - a self-check" in capsys.readouterr().out
    assert {r["isolation"] for r in csv.DictReader(out.open(encoding="utf-8"))} == {"none"}


def test_a_stub_keeps_the_signature_and_says_why():
    source = (
        "import math\n\nclass Adam:\n    lr = 1\n    def step(self, x):\n        return x + 1\n\n"
        "def helper(n):\n    return math.sqrt(n)\n\ndef answer(a, *, b=2):\n    '''doc'''\n"
        "    return a * b\n"
    )
    stubbed = stub_source(source, {"Adam": "m:Adam", "answer": "m:answer"})
    namespace: dict = {}
    exec(compile(stubbed, "<stub>", "exec"), namespace)
    assert namespace["helper"](9) == 3  # a building block stays
    assert namespace["Adam"].lr == 1
    for call in (lambda: namespace["Adam"]().step(1), lambda: namespace["answer"](1, b=3)):
        with pytest.raises(RuntimeError, match="is the course's own answer .* absent"):
            call()
    assert "return a * b" not in stubbed and "doc" not in stubbed
    with pytest.raises(ValueError, match=r"targets = \['nope'\]: expected definitions"):
        stub_source(source, {"nope": "m:nope"})
