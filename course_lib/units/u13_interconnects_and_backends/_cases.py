"""Unit 13's drawn cases: what tasks 2-4 ask about under this grading's seed.

Every draw comes from ``case_rng(task, UNIT)`` (course_lib.grading.seeds): another seed asks
about other links, models and scenarios, so no table copied from the checks or number printed in
the lecture answers them. The draws keep each task's edge cases: latency-bound and
bandwidth-bound buckets, a backward that hides everything, NVLink (whose headline counts both
directions) beside links that quote one direction.
"""

from __future__ import annotations

import math

from course_lib.grading.seeds import case_rng

UNIT = "u13_interconnects_and_backends"
MiB = 2**20
CANDIDATES = (MiB // 4, MiB, 4 * MiB, 16 * MiB, 64 * MiB, 256 * MiB)
#: (name, alpha range s, bandwidth range B/s, backward range s, gradient MiB range)
_KINDS = (
    ("high latency (gloo-like)", (1e-3, 4e-3), (0.5e9, 2e9), (0.2, 0.8), (200, 800)),
    ("NVLink node, short backward", (20e-6, 80e-6), (150e9, 450e9), (0.005, 0.02), (1000, 4000)),
    ("InfiniBand, long backward", (10e-6, 50e-6), (12e9, 50e9), (0.2, 0.5), (1000, 4000)),
    ("slow Ethernet, short backward", (50e-6, 200e-6), (0.6e9, 2.5e9), (0.02, 0.08), (50, 200)),
    (
        "low latency, backward hides everything",
        (5e-6, 20e-6),
        (150e9, 450e9),
        (0.1, 0.4),
        (1000, 4000),
    ),
)


def _clear_winner(alpha: float, beta: float, bwd: float, grad: int) -> bool:
    """The best candidate beats the next by more than 1e-6 (or ties exactly): float rounding in
    a learner's arithmetic cannot swap them."""
    from course_lib.measure import estimate

    times = sorted(
        estimate.ddp_exposed_comm_time(b, grad_bytes=grad, backward_s=bwd, alpha=alpha, beta=beta)
        for b in CANDIDATES
    )
    a, b = times[0], times[1]
    return math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-15) or b - a > 1e-6 * max(b, 1e-12)


_Scenario = tuple[str, float, float, float, int, tuple[int, ...]]


def bucket_scenarios(task: int) -> list[_Scenario]:
    """Task 2: one scenario per kind, (name, alpha, beta, backward s, gradient bytes, candidates)."""
    rng = case_rng(task, UNIT)
    out: list[_Scenario] = []
    for name, (a0, a1), (w0, w1), (b0, b1), (g0, g1) in _KINDS:
        while True:
            alpha = round(rng.uniform(a0, a1), 7)
            beta = 1 / round(rng.uniform(w0, w1), -6)
            bwd = round(rng.uniform(b0, b1), 4)
            grad = rng.randint(g0, g1) * MiB
            if _clear_winner(alpha, beta, bwd, grad):
                break
        out.append((name, alpha, beta, bwd, grad, CANDIDATES))
    return out


def link_cases(task: int) -> list[tuple[int, str, int, str]]:
    """Task 3: five (n_params, dtype, world_size, link): both NVLinks, three other links."""
    rng = case_rng(task, UNIT)
    others = rng.sample(
        ["PCIe 4.0 x16", "PCIe 5.0 x16", "InfiniBand NDR", "InfiniBand HDR", "100 GbE"], 3
    )
    cases = [
        (
            rng.randint(5, 700) * 10**8,
            rng.choice(("bf16", "fp16", "fp32")),
            rng.choice((2, 4, 8, 16, 32, 64)),
            link,
        )
        for link in ["NVLink A100", "NVLink H100", *others]
    ]
    rng.shuffle(cases)
    return cases


def scale_models(task: int) -> tuple[int, int]:
    """Task 4: a model of 2B-20B and one of 30B-200B parameters (never the lecture's 7B, 70B)."""
    rng = case_rng(task, UNIT)
    small = rng.choice([n for n in range(2, 21) if n != 7])
    large = rng.choice([n for n in range(30, 201, 5) if n != 70])
    return small * 10**9, large * 10**9
