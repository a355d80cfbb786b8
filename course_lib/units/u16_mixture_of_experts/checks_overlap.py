"""Unit 16's task 4 (``checks.py`` re-exports it): when expert parallelism's all-to-all hides.

``ep_hiding(hidden, ffn, experts, ep, link_GBps, alpha_s) -> tokens_per_expert``: the tokens
(assignments) each expert must receive per MoE layer for its matmuls to take as long as the
dispatch and combine all-to-alls, on H100s at the dense bf16 peak (989 TFLOP/s), SwiGLU experts,
bf16 rows, balanced routing; ``math.inf`` where no number of tokens hides them. Graded at three
drawn layouts (one over NVLink, one over InfiniBand, one either), within 1e-6 relative, against
``estimate.ep_overlap_min_tokens_per_expert`` (out of reach).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from course_lib.grading.core import fail, passed, run_learner
from course_lib.grading.plain import learner_value
from course_lib.grading.split import need_list, split_check

__all__ = ["EP_SHAPES", "ep_cases", "ep_answer", "check_ep_overlap"]

UNIT = "u16_mixture_of_experts"
FORBID = ("course_lib.measure.estimate.overlap:ep_overlap_min_tokens_per_expert",)
#: (hidden, ffn, experts, ep) task 4 draws from: fine-grained and coarse experts
EP_SHAPES = (
    (2048, 1408, 64, 8),
    (2048, 1408, 64, 16),
    (4096, 14336, 8, 8),
    (5120, 1536, 160, 32),
    (7168, 2048, 256, 64),
    (7168, 2048, 256, 32),
    (6144, 16384, 8, 8),
)
NVLINK, IB = (450.0, 900.0), (25.0, 50.0, 100.0)
ALPHAS = (4e-6, 2e-5, 5e-5)  # never the lecture's 10 µs
RTOL = 1e-6


def ep_cases(task: int = 4) -> list[tuple[int, int, int, int, float, float]]:
    from course_lib.grading.seeds import case_rng

    rng = case_rng(task, UNIT)
    links = [rng.choice(NVLINK), rng.choice(IB), rng.choice(NVLINK + IB)]
    return [(*rng.choice(EP_SHAPES), b, rng.choice(ALPHAS)) for b in links]


def ep_answer(hidden: int, ffn: int, experts: int, ep: int, link: float, alpha: float) -> float:
    from course_lib.measure import estimate

    return estimate.ep_overlap_min_tokens_per_expert(
        hidden=hidden, ffn=ffn, experts=experts, ep=ep, gated_mlp=True, alpha_s=alpha,
        peak_flops=estimate.H100_PEAK_FLOPS["bf16"], link_GBps=link,
    )  # fmt: skip


def collect_ep_overlap(ep_hiding: Callable[..., Any], task: int = 4) -> list[Any]:
    """``ep_hiding(hidden, ffn, experts, ep, link_GBps, alpha_s) -> tokens per expert``."""
    return [
        learner_value(run_learner(task, ep_hiding, *case, forbid=FORBID), builtin_only=True)
        for case in ep_cases(task)
    ]


def judge_ep_overlap(answers: Any, task: int = 4) -> None:
    cases = ep_cases(task)
    need_list(task, answers, len(cases), "answer", "layouts")
    for case, got in zip(cases, answers):
        call = "ep_hiding({}, {}, {}, {}, {:g}, {:g})".format(*case)
        if not isinstance(got, int | float) or isinstance(got, bool):
            fail(task, f"{call}: expected a number (or math.inf), got {got!r}")
        want = ep_answer(*case)
        if math.isinf(want) != math.isinf(got):
            fail(task, f"{call} = {got:g}: " + ("no number of tokens hides the all-to-all here"
                                                if math.isinf(want) else "a finite number hides it"))  # fmt: skip
        if not math.isinf(want) and abs(got - want) > RTOL * abs(want):
            fail(task, f"{call} = {got:,.6g}: too {'large' if got > want else 'small'}")
    passed(task, "the tokens per expert that hide the all-to-all, at three drawn layouts and links")


check_ep_overlap = split_check(collect_ep_overlap, judge_ep_overlap)
