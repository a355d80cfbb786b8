"""Unit 17's task 4 (``checks.py`` re-exports it): when FSDP's collectives hide, in bf16 and in FP8.

``fp8_overlap(world_size, link_GBps) -> (bf16_tokens, fp8_tokens)``: the tokens per GPU above
which FSDP's all-gathers and reduce-scatters hide behind the matmuls on H100s (dense peaks 989
and 1,979 TFLOP/s), first with bf16 matmuls and a bf16 gather, then with FP8 matmuls and an FP8
gather (bf16 gradients both times). Graded at three (world size, link) pairs drawn from the
grading seed, each within 1e-6 relative, against ``estimate.fsdp_overlap_min_tokens`` (out of
reach).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from course_lib.grading.core import fail, passed, run_learner
from course_lib.grading.plain import learner_value
from course_lib.grading.split import need_list, split_check

__all__ = ["OVERLAP_CASES", "overlap_cases", "overlap_answer", "check_fp8_overlap"]

UNIT = "u17_fp8_training"
FORBID = (
    "course_lib.measure.estimate.overlap:fsdp_overlap_min_tokens",
    "course_lib.measure.estimate.overlap:dp_overlap_min_tokens",
)
#: (world size, GB/s per direction) task 4 draws three from
OVERLAP_CASES = tuple((n, b) for n in (6, 8, 24, 64, 96, 512) for b in (25.0, 50.0, 100.0, 450.0))
RTOL = 1e-6


def overlap_cases(task: int = 4) -> list[tuple[int, float]]:
    from course_lib.grading.seeds import case_rng

    return case_rng(task, UNIT).sample(OVERLAP_CASES, 3)


def overlap_answer(world_size: int, link_GBps: float) -> tuple[float, float]:
    """The reference: (bf16 matmuls + bf16 gather, FP8 matmuls + FP8 gather) thresholds."""
    from course_lib.measure import estimate

    peak = estimate.H100_PEAK_FLOPS
    kw: dict[str, Any] = dict(world_size=world_size, link_GBps=link_GBps)
    return (
        estimate.fsdp_overlap_min_tokens(peak_flops=peak["bf16"], **kw),
        estimate.fsdp_overlap_min_tokens(peak_flops=peak["fp8"], param_bytes=1, **kw),
    )


def collect_fp8_overlap(fp8_overlap: Callable[..., Any], task: int = 4) -> list[Any]:
    """``fp8_overlap(world_size, link_GBps) -> (bf16_tokens, fp8_tokens)``, two floats."""
    return [
        learner_value(run_learner(task, fp8_overlap, n, b, forbid=FORBID))
        for n, b in overlap_cases(task)
    ]


def judge_fp8_overlap(answers: Any, task: int = 4) -> None:
    cases = overlap_cases(task)
    need_list(task, answers, len(cases), "answer")
    for (n, b), got in zip(cases, answers):
        where = f"fp8_overlap({n}, {b:g})"
        if not (isinstance(got, tuple) and len(got) == 2):
            fail(task, f"{where}: expected a tuple (bf16_tokens, fp8_tokens)")
        for name, value, want in zip(("bf16_tokens", "fp8_tokens"), got, overlap_answer(n, b)):
            if not isinstance(value, int | float) or isinstance(value, bool):
                fail(task, f"{where} {name}: expected a number, got {type(value).__name__}")
            if abs(value - want) > RTOL * abs(want):
                fail(
                    task,
                    f"{where} {name} = {value:,.6g}: too {'large' if value > want else 'small'}",
                )
    passed(task, "FSDP's hiding threshold in bf16 and in FP8 at three drawn clusters and links")


check_fp8_overlap = split_check(collect_fp8_overlap, judge_fp8_overlap)
