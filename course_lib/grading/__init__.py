"""Grading: verdict helpers, per-unit checks, an exercise made from its solution, the grade command.

Import-light on purpose: importing ``course_lib.grading`` (as every check cell does) loads only the
standard library. The helpers below come from :mod:`course_lib.grading.core`; the grader (which
needs nbformat / nbclient) is loaded on first use. Building ``exercises/`` and re-executing
notebooks are the maintainers' (``course_tools.exercises``, ``course_tools.execute``).

    python -m course_lib.grade NOTEBOOK.ipynb             # score a learner's notebook per task
    grade_here()                                          # the same, from the notebook's own kernel
    python -m course_lib.grading.exercises reset NN       # start unit NN's exercise over
"""

from __future__ import annotations

import importlib
from typing import Any

from course_lib.grading.core import (
    check_close,
    check_equal,
    expect_int,
    fail,
    fmt_int,
    passed,
    refuse,
    run_learner,
)

_LAZY = {
    "ExerciseError": "course_lib.grading.exercises",
    "grade_notebook": "course_lib.grading.grader",
    "grade_here": "course_lib.grading.here",
    "GradeReport": "course_lib.grading.grader",
    "TaskResult": "course_lib.grading.grader",
    "GradingInputError": "course_lib.grading.grader",
    "watch_references": "course_lib.grading.references",
}

__all__ = [
    "ExerciseError",
    "GradeReport",
    "GradingInputError",
    "TaskResult",
    "check_close",
    "check_equal",
    "expect_int",
    "fail",
    "fmt_int",
    "grade_here",
    "grade_notebook",
    "passed",
    "refuse",
    "run_learner",
    "watch_references",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'course_lib.grading' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
