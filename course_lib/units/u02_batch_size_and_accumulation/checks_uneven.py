"""Unit 02's check of task 5 (find the bug): an accumulation loop that weights unequal
micro-batches equally; named and fixed, the fixed loop graded as task 3's (two calls in a row
against the full batch, :mod:`.checks_accumulation`). Re-exported by :mod:`.checks`."""

from __future__ import annotations

from typing import Any

from course_lib.grading.core import passed
from course_lib.grading.plain import bug_data, judge_bug
from course_lib.grading.split import split_check
from course_lib.units.u02_batch_size_and_accumulation.checks_accumulation import (
    _RTOL,
    _accumulation_cases,
    _collect_case,
    _judge_case,
    _runs,
)

# ---------------------------------------------------------------------------------- task 5
#: diagnoses offered for the buggy loop of solutions/02_batch_size_and_accumulation.ipynb
UNEVEN_BUG_CHOICES = {
    "a": "zero_grad() belongs inside the loop",
    "b": "the micro-batches differ in size, and dividing each mean loss by their number over-weights the short one",
    "c": "backward() should run once, after the loop",
    "d": "optimizer.step() should run after every micro-batch",
}


def collect_uneven_accumulation(bug: str, accumulation_step: Any, task: int = 5) -> dict[str, Any]:
    """Task (find the bug): name the bug of a loop that divides every micro-batch mean by the
    number of micro-batches when the last micro-batch is shorter, and fix it; the fixed loop
    must equal one full-batch step (float64, rtol 1e-9) twice in a row."""
    data = bug_data(bug)
    if isinstance(bug, str) and bug.strip().lower() == "b":  # the fix is run only then
        data["cases"] = [
            _collect_case(accumulation_step, task, seed, batch, k)
            for seed, batch, k in _accumulation_cases(task, uneven=True)
        ]
    return data


def judge_uneven_accumulation(data: Any, task: int = 5) -> None:
    judge_bug(
        task,
        data,
        UNEVEN_BUG_CHOICES,
        "b",
        "the loop is right about that; compare the micro-batch sizes of a batch of 10 in 3 chunks",
    )
    cases = _accumulation_cases(task, uneven=True)
    for (seed, batch, k), runs in zip(cases, _runs(task, data.get("cases"), len(cases))):
        _judge_case(runs, task, seed, batch, k)
    passed(
        task,
        f"bug named; with a shorter last micro-batch in 2 unseen cases, 2 accumulated steps "
        f"in a row equal 2 full-batch steps (float64, rtol={_RTOL:g})",
    )


check_uneven_accumulation = split_check(collect_uneven_accumulation, judge_uneven_accumulation)
