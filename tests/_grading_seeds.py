"""Helpers for the tests of the graded checks under several grading seeds.

``seed`` (a fixture: import ``seed_fixture`` into a test module, then ask for ``seed``) runs a test
under a grading seed other than the notebooks' default (0). Seed 0 runs elsewhere already: every
solution's check cells run at seed 0 in the solution's grade (tests/test_course.py, each compared
with its stored ✓ line), and ``copied_fails`` passes seed 0's answers under seed 0. ``copied_fails`` replays the default seed's answers, in call order, as a learner who copied a
table would, and requires the check to pass under seed 0 and fail under seed 7.
"""

from __future__ import annotations

from typing import Any, Callable

import pytest

SEEDS = ("0", "7")  # the notebooks' default and another grading's
FIXTURE_SEEDS = ("7",)  # seed 0: see the module's docstring


@pytest.fixture(params=FIXTURE_SEEDS, name="seed")
def seed_fixture(request, monkeypatch):
    """Each test that asks for ``seed`` runs under a grading seed other than the default."""
    monkeypatch.setenv("COURSE_GRADE_SEED", request.param)
    return request.param


def recorded(fn: Callable[..., Any]) -> tuple[Callable[..., Any], list]:
    """``fn``, and the list of every answer it gives, in call order."""
    answers: list = []

    def record(*args, **kwargs):
        answers.append(fn(*args, **kwargs))
        return answers[-1]

    return record, answers


def replay(answers: list) -> Callable[..., Any]:
    """A copied answer: the recorded answers in call order, whatever it is asked."""
    calls = iter(range(10**9))
    return lambda *args, **kwargs: answers[min(next(calls), len(answers) - 1)]


def copied_fails(monkeypatch, check, right, *args, task: int, **kwargs) -> None:
    """Seed 0's answers of ``right``, replayed as a table, pass under seed 0 and fail (✗) under
    seed 7. ``args`` go before the learner's function (a bug letter), ``kwargs`` after it."""
    monkeypatch.setenv("COURSE_GRADE_SEED", "0")
    record, answers = recorded(right)
    check(*args, record, task=task, **kwargs)
    check(*args, replay(answers), task=task, **kwargs)
    monkeypatch.setenv("COURSE_GRADE_SEED", "7")
    with pytest.raises(AssertionError, match=f"✗ task {task}: "):
        check(*args, replay(answers), task=task, **kwargs)
