"""Unit 15's task 4 (``checks.py`` re-exports it): the shortest context at which ring attention
hides its K/V transfer.

``shortest_hidden_context(heads, kv_heads, tp, cp, link_GBps, causal, mfu) -> seq``: on H100s
computing at ``mfu`` of the dense bf16 peak (989 TFLOP/s), bf16 K/V, the smallest sequence length (a whole number of tokens
per rank) at which each ring step's K/V transfer over a link of ``link_GBps`` GB/s per
direction takes no longer than the step's attention matmuls; ``causal`` with the zig-zag
layout (half of each step's block computed). Graded at three drawn cases, to one token per
rank (the threshold can be a whole number, where rounding decides), against
``estimate.cp_ring_overlap_min_tokens`` (out of reach).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from course_lib.grading.core import fail, passed, run_learner
from course_lib.grading.plain import learner_value
from course_lib.grading.split import need_list, split_check

__all__ = ["RING_MODELS", "ring_cases", "ring_answer", "check_ring_overlap"]

UNIT = "u15_context_parallelism"
FORBID = ("course_lib.measure.estimate.overlap:cp_ring_overlap_min_tokens",)
#: (heads, kv_heads) task 4 draws from: multi-head and grouped K/V
RING_MODELS = ((32, 32), (32, 8), (64, 8), (96, 8), (128, 8), (40, 40))
LINKS = (25.0, 50.0, 100.0, 450.0)
MFUS = (0.35, 0.4, 0.45, 0.55)  # never 1: the lecture prints the thresholds at the peak


def ring_cases(task: int = 4) -> list[tuple[int, int, int, int, float, bool, float]]:
    from course_lib.grading.seeds import case_rng

    rng = case_rng(task, UNIT)
    cases = []
    for causal in (False, True, rng.choice((False, True))):
        heads, kv = rng.choice(RING_MODELS)
        tp = rng.choice(
            [t for t in (1, 2, 4, 8) if heads % t == 0 and (kv % t == 0 or t % kv == 0)]
        )
        link, mfu = rng.choice(LINKS), rng.choice(MFUS)
        cases.append((heads, kv, tp, rng.choice((4, 8, 16, 32)), link, causal, mfu))
    return cases


def ring_answer(
    heads: int, kv_heads: int, tp: int, cp: int, link: float, causal: bool, mfu: float = 1.0
) -> int:
    from course_lib.measure import estimate

    n = estimate.cp_ring_overlap_min_tokens(
        heads=heads, kv_heads=kv_heads, tp=tp, causal=causal, link_GBps=link, mfu=mfu,
        peak_flops=estimate.H100_PEAK_FLOPS["bf16"],
    )  # fmt: skip
    return cp * math.ceil(n)  # a whole number of tokens per rank


def collect_ring_overlap(fn: Callable[..., Any], task: int = 4) -> list[Any]:
    """``fn(heads, kv_heads, tp, cp, link_GBps, causal, mfu) -> seq``, an int, three cases."""
    return [
        learner_value(run_learner(task, fn, *case, forbid=FORBID), builtin_only=True)
        for case in ring_cases(task)
    ]


def judge_ring_overlap(answers: Any, task: int = 4) -> None:
    cases = ring_cases(task)
    need_list(task, answers, len(cases), "answer")
    for case, got in zip(cases, answers):
        call = "shortest_hidden_context({}, {}, {}, {}, {:g}, {}, {:g})".format(*case)
        if not isinstance(got, int) or isinstance(got, bool):
            fail(task, f"{call}: expected an int (tokens), got {got!r}")
        want = ring_answer(*case)
        if abs(got - want) > case[3]:  # one token per rank either way: n may be a whole number
            what = "longer than the shortest" if got > want else "too short: the transfer shows"
            fail(task, f"{call} = {got:,}: {what}")
    passed(task, "the shortest context that hides ring attention's transfer, three drawn cases")


check_ring_overlap = split_check(collect_ring_overlap, judge_ring_overlap)
