"""Unit 18's task 4 (``checks.py`` re-exports it): how far an elastic run may grow before data
parallelism stops hiding its gradient all-reduce.

``largest_dp(global_tokens, link_GBps) -> world_size``: a run keeps its global batch of
``global_tokens`` tokens per step whatever the number N of data-parallel GPUs it restarts on,
so each GPU's backward sees global_tokens / N tokens. On H100s (989 TFLOP/s dense bf16) with
bf16 gradients reduced by a ring all-reduce over a link of ``link_GBps`` GB/s per direction,
the largest N at which the all-reduce still takes no longer than backward's matmuls. Graded at
three drawn (batch, link) pairs, exactly, against ``estimate.dp_overlap_min_tokens`` (out of
reach).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from course_lib.grading.core import fail, passed, run_learner
from course_lib.grading.plain import learner_value
from course_lib.grading.split import need_list, split_check

__all__ = ["DP_CASES", "dp_cases", "largest_dp", "check_dp_overlap"]

UNIT = "u18_failures_and_checkpoints"
FORBID = (
    "course_lib.measure.estimate.overlap:dp_overlap_min_tokens",
    "course_lib.measure.estimate.overlap:fsdp_overlap_min_tokens",
)
#: (global batch in tokens, GB/s per direction) task 4 draws three from
DP_CASES = tuple(
    (g, b) for g in (2**19, 3 * 2**19, 2**21, 5 * 2**20, 2**23) for b in (25.0, 50.0, 100.0, 450.0)
)


def dp_cases(task: int = 4) -> list[tuple[int, float]]:
    from course_lib.grading.seeds import case_rng

    return case_rng(task, UNIT).sample(DP_CASES, 3)


def largest_dp(global_tokens: int, link_GBps: float) -> int:
    """The reference: the largest N with global_tokens / N >= dp_overlap_min_tokens(N)."""
    from course_lib.measure import estimate

    def hides(n: int) -> bool:
        need = estimate.dp_overlap_min_tokens(
            world_size=n, peak_flops=estimate.H100_PEAK_FLOPS["bf16"], link_GBps=link_GBps
        )
        return global_tokens / n >= need

    n = 1
    while hides(n * 2):
        n *= 2
    lo, hi = n, n * 2  # hides(lo), not hides(hi): the threshold grows with n, tokens shrink
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if hides(mid) else (lo, mid)
    return lo


def collect_dp_overlap(fn: Callable[..., Any], task: int = 4) -> list[Any]:
    """``fn(global_tokens, link_GBps) -> world_size``, an int, at three drawn cases."""
    return [
        learner_value(run_learner(task, fn, g, b, forbid=FORBID), builtin_only=True)
        for g, b in dp_cases(task)
    ]


def judge_dp_overlap(answers: Any, task: int = 4) -> None:
    cases = dp_cases(task)
    need_list(task, answers, len(cases), "answer")
    for (g, b), got in zip(cases, answers):
        call = f"largest_dp({g:,}, {b:g})"
        if not isinstance(got, int) or isinstance(got, bool):
            fail(task, f"{call}: expected an int (GPUs), got {got!r}")
        want = largest_dp(g, b)
        if got != want:
            what = "the all-reduce no longer hides" if got > want else "it still hides at more"
            fail(task, f"{call} = {got:,}: {what}")
    passed(
        task, "the largest data-parallel size that still hides the all-reduce, three drawn cases"
    )


check_dp_overlap = split_check(collect_dp_overlap, judge_dp_overlap)
