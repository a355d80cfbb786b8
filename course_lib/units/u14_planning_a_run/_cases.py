"""Unit 14's drawn cases: what each graded check asks about under this grading's seed.

Every draw comes from ``case_rng(task, UNIT)`` (course_lib.grading.seeds): another seed asks
about other clusters, plans and layouts, so no table copied from the checks or layout printed
in the lecture answers them. The draws keep each task's edge cases: a sound plan, each problem
alone, two at once, a batch off by half a sequence; every recomputation mode.
"""

from __future__ import annotations

import math
import random
from typing import Any

from course_lib.grading.seeds import case_rng

UNIT = "u14_planning_a_run"
CLUSTER = "8xH100 + 400G IB"
SIZE_MODEL = "Llama-2-70B"
SIZE_GPUS = (32, 128, 256, 512, 1024)  #: the lecture planned 64; 2048 would leave dp > the batch
BUDGET_SLACK = 1.4  #: the budget: this many times the planner's fastest plan (to 0.1 day up)
_BEST: dict[tuple[int, float], float] = {}
#: (model name, gpus, (dp, tp, pp, micro_batch), global batch tokens)
_Plan = tuple[str, int, tuple[int, int, int, int], int]


def size_case(task: int) -> dict[str, Any]:
    """Task 1: Llama-2-70B on a drawn number of H100s, a drawn number of tokens (100B-400B),
    4 Mi tokens per step, and a budget in days BUDGET_SLACK x the planner's fastest plan."""
    from course_lib import plan as P

    rng = case_rng(task, UNIT)
    gpus, tokens = rng.choice(SIZE_GPUS), rng.randint(10, 40) * 10e9
    key = (gpus, tokens)
    if key not in _BEST:
        best = P.plan(
            P.model(SIZE_MODEL),
            P.cluster(CLUSTER, gpus=gpus),
            global_batch_tokens=4 * 2**20,
            total_tokens=tokens,
        )
        _BEST[key] = float(best[best.fits]["days"].min())
    return {
        "model": SIZE_MODEL,
        "cluster": CLUSTER,
        "gpus": gpus,
        "global_batch_tokens": 4 * 2**20,
        "total_tokens": tokens,
        "budget_days": math.ceil(10 * BUDGET_SLACK * _BEST[key]) / 10,
    }


def _problem_plan(rng: random.Random, want: frozenset[str]) -> _Plan:
    """(model name, gpus, (dp, tp, pp, micro_batch), global batch tokens) with problems ``want``."""
    s = 4096  # both models' sequence length
    for _ in range(10_000):
        name = rng.choice(("Llama-2-7B", "Llama-2-70B"))
        gpus = rng.choice((8, 16, 32, 64, 128))
        tp = rng.choice((1, 2, 4, 8, 16))
        pp = rng.choice((1, 2, 4, 8))
        if gpus % (tp * pp) or (name == "Llama-2-7B" and tp > 8):
            continue
        dp, mb = gpus // (tp * pp), rng.choice((1, 1, 2))
        per = dp * mb
        seqs = (
            per * rng.randint(1, 3)
            if "fewer_microbatches_than_stages" in want
            else per * rng.randint(8, 64)
        )
        if "batch_not_divisible" in want:
            seqs += rng.randint(1, per - 1) if per > 1 else 0
        tokens = seqs * s + (s // 2 if "batch_not_divisible" in want and per == 1 else 0)
        found = set()
        if tp > 8:
            found.add("tp_across_nodes")
        q, rest = divmod(tokens, s)
        if rest or q % per:
            found.add("batch_not_divisible")
        elif q // per < pp:
            found.add("fewer_microbatches_than_stages")
        if found == set(want):
            return name, gpus, (dp, tp, pp, mb), tokens
    raise RuntimeError(f"no plan drawn with problems {sorted(want)}")  # pragma: no cover


def problem_cases(task: int) -> list[_Plan]:
    """Task 2: eight plans: two sound, each problem alone, two pairs of problems."""
    rng = case_rng(task, UNIT)
    T, F, B = "tp_across_nodes", "fewer_microbatches_than_stages", "batch_not_divisible"
    wants = [(), (), (T,), (F,), (B,), (B,), (T, F), (T, B)]
    cases = [_problem_plan(rng, frozenset(w)) for w in wants]
    rng.shuffle(cases)
    return cases


def mfu_cases(task: int) -> list[dict[str, Any]]:
    """Task 3: two layouts (7B on 8-16 GPUs, 70B on 64), each recomputation mode drawn, the
    global batch (1-2 Mi tokens) and the new sequence length (2 or 4 x the model's)."""
    rng = case_rng(task, UNIT)
    recs = rng.sample(("none", "selective", "full"), 2)
    small_tp, small_pp = rng.choice((1, 2, 4)), rng.choice((1, 2, 4))
    small_gpus = max(rng.choice((8, 16)), small_tp * small_pp)  # TP 4 x PP 4 needs 16
    big_tp, big_pp = rng.choice((4, 8)), rng.choice((2, 4))
    return [
        {
            "model": "Llama-2-7B",
            "gpus": small_gpus,
            "layout": (small_gpus // (small_tp * small_pp), small_tp, small_pp),
            "recompute": recs[0],
            "tokens": 2 ** rng.randint(20, 21),
            "factor": rng.choice((2, 4)),
        },
        {
            "model": "Llama-2-70B",
            "gpus": 64,
            "layout": (64 // (big_tp * big_pp), big_tp, big_pp),
            "recompute": recs[1],
            "tokens": 2 ** rng.randint(20, 21),
            "factor": rng.choice((2, 4)),
        },
    ]
