"""``grade_here()``: an exercise graded from its own kernel, as the grade command grades it."""

from __future__ import annotations

import pytest

from course_lib.grading import grade_here
from course_lib.grading.here import GRADING_ENV


@pytest.mark.slow  # a fresh kernel runs the fixture exercise (about 10 s on 2 busy cores)
def test_grades_the_saved_notebook_the_server_named(exercise, solutions_dir, monkeypatch, capsys):
    # what the Jupyter server tells a notebook's kernel; the grader's kernel runs the notebook's
    # own grade_here cell too, which must not grade it again (it prints one line there)
    monkeypatch.setenv("JPY_SESSION_NAME", str(exercise))
    monkeypatch.delenv(GRADING_ENV, raising=False)
    assert grade_here(solutions=solutions_dir) == 1
    out = capsys.readouterr().out
    assert out.startswith("grading 99_fixture.ipynb as saved at ")
    assert "✗" in out and out.rstrip().endswith("score: 0/4 points"), out


def test_without_a_notebook_or_while_graded_it_grades_nothing(monkeypatch, capsys):
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    monkeypatch.delenv(GRADING_ENV, raising=False)
    assert grade_here() is None
    assert "python -m course_lib.grade NOTEBOOK.ipynb" in capsys.readouterr().out
    monkeypatch.setenv(GRADING_ENV, "1")
    assert grade_here() is None
    assert "does nothing while the notebook is being graded" in capsys.readouterr().out
