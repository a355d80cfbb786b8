"""Unit 12's drawn cases: what each graded check asks about under this grading's seed.

Every draw comes from ``case_rng(task, UNIT)`` (course_lib.grading.seeds): another seed asks
about other pipelines, so no table copied from the checks or number printed in the lecture
answers them. The draws keep the edge cases of each task: a pipeline that never fills
(m <= p), the bottleneck stage anywhere, every schedule, the smallest interleaved setup.
"""

from __future__ import annotations

import random
from typing import Any

from course_lib.grading.seeds import case_rng

UNIT = "u12_pipeline_parallelism"
BUBBLE_RANKS = 3  #: task 1 runs GPipe on this many real ranks


def _uneven(rng: random.Random, stages: int, most: int = 4) -> list[int]:
    """Layers per stage, 1..most each, never all equal (the bottleneck is drawn too)."""
    while True:
        sizes = [rng.randint(1, most) for _ in range(stages)]
        if len(set(sizes)) > 1:
            return sizes


def bubble_cases(task: int) -> list[dict[str, Any]]:
    """Task 1: two GPipe pipelines on :data:`BUBBLE_RANKS` ranks with uneven stages, one with
    few micro-batches (2..p: it never fills), one with many (p+1..3p)."""
    rng = case_rng(task, UNIT)
    p = BUBBLE_RANKS
    return [
        {"sizes": _uneven(rng, p), "microbatches": rng.randint(2, p)},
        {"sizes": _uneven(rng, p), "microbatches": rng.randint(p + 1, 3 * p)},
    ]


def replay_cases(task: int) -> list[dict[str, Any]]:
    """Task 2: one pipeline per schedule (GPipe, 1F1B, interleaved 1F1B), ranks, micro-batches,
    stages per rank and layers per stage drawn; the interleaved one with m = p or 2p."""
    rng = case_rng(task, UNIT)
    cases = []
    for schedule in ("gpipe", "1f1b", "interleaved"):
        p = rng.randint(2, 4)
        v = rng.randint(2, 3) if schedule == "interleaved" else 1
        m = p * rng.randint(1, 2) if schedule == "interleaved" else rng.randint(p, 2 * p + 2)
        cases.append(
            {
                "schedule": schedule,
                "ranks": p,
                "microbatches": m,
                "virtual": v,
                "layers": _uneven(rng, p * v, 3),
            }
        )
    rng.shuffle(cases)
    return cases


def holder_case(task: int) -> dict[str, int]:
    """Task 3: the real step on 2 ranks with the stages in a V: chunks (3 or 4: a V that turns
    more than once), micro-batches (2 or 4) and the model's seed."""
    rng = case_rng(task, UNIT)
    return {
        "virtual": rng.randint(3, 4),
        "microbatches": rng.choice((2, 4)),
        "seed": rng.randrange(1000),
    }
