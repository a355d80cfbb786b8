"""Unit 10's drawn cases: what each graded check asks about under this grading's seed.

Every draw comes from ``case_rng(task, UNIT)`` (course_lib.grading.seeds): the same seed draws
the same cases, another seed other ones, so no table copied from the checks or number printed
in the lecture answers them. Each draw keeps the edge cases the task is about (padding, an exact
fit, a plan that fits nowhere, one GPU).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from fractions import Fraction

from course_lib.grading.seeds import case_rng

UNIT = "u10_zero_fsdp"
#: hidden widths the MLP of tasks 1 and 3 is drawn from (8 -> w -> w/2 -> 2)
MLP_WIDTHS = tuple(range(18, 47, 2))
#: hidden widths of the memory model of task 2 (8 -> w -> w/2 -> 3, float32); the lecture's is 250
MEMORY_WIDTHS = tuple(w for w in range(120, 321, 4) if w != 250)
#: GPU memory sizes (GB) the plans of task 4 are drawn from
GPU_GB = (16, 24, 32, 40, 48, 64, 80, 94, 96, 141, 192)
WORLD_SIZES = (2, 4, 8, 16, 32, 64, 128, 256, 512)


def mlp_params(width: int, out: int = 2) -> int:
    """Parameters of the MLP 8 -> width -> width/2 -> out (biases included)."""
    half = width // 2
    return 8 * width + width + width * half + half + half * out + out


def training_case(task: int, world_size: int) -> dict[str, int]:
    """Tasks 1 and 3: the MLP's width (its parameter count never a multiple of ``world_size``:
    the flat layout always has padding), its seed and the batches' seed."""
    rng = case_rng(task, UNIT)
    widths = [w for w in MLP_WIDTHS if mlp_params(w) % world_size]
    return {"width": rng.choice(widths), "seed": rng.randrange(1000), "batch": rng.randrange(1000)}


def memory_case(task: int, world_size: int) -> dict[str, int]:
    """Task 2: the memory model's hidden width (some unit padded at ``world_size``)."""
    rng = case_rng(task, UNIT)
    widths = [
        w
        for w in MEMORY_WIDTHS
        if any(n % world_size for n in (9 * w, (w // 2) * (w + 1), 3 * (w // 2 + 1)))
    ]
    return {"width": rng.choice(widths)}


def _state(n: int, world_size: int, stage: int) -> Fraction:
    """Bytes per GPU of 16 B/param model state at ``stage`` (exact)."""
    w = world_size
    return (
        Fraction(2 * n, w if stage == 3 else 1)
        + Fraction(2 * n, w if stage >= 2 else 1)
        + Fraction(12 * n, w if stage >= 1 else 1)
    )


def lowest_stage(n: int, world_size: int, gpu_gb: int) -> int | None:
    """The check's own answer for a drawn plan (exact arithmetic)."""
    cap = gpu_gb * 10**9
    return next((s for s in range(4) if _state(n, world_size, s) <= cap), None)


def _clear(n: int, world_size: int, gpu_gb: int) -> bool:
    """No stage within 0.1 % of the GPU's size: float arithmetic cannot tip the answer."""
    cap = gpu_gb * 10**9
    return all(abs(_state(n, world_size, s) - cap) > cap / 1000 for s in range(4))


def _plan_with(rng: random.Random, want: int | None, sizes: Sequence[int]) -> tuple[int, int, int]:
    for _ in range(10_000):
        n = rng.randrange(5, 4000) * 10**8  # 0.5B - 400B parameters
        w, gb = rng.choice(sizes), rng.choice(GPU_GB)
        if lowest_stage(n, w, gb) == want and _clear(n, w, gb):
            return n, w, gb
    raise RuntimeError(f"no plan drawn with answer {want}")  # pragma: no cover


def _exact_fit(rng: random.Random, stage: int) -> tuple[int, int, int]:
    """A plan whose model state at ``stage`` is exactly the GPU's size (<= fits, < does not)."""
    for _ in range(10_000):
        w, gb = rng.choice(WORLD_SIZES[:6]), rng.randrange(12, 200)
        per_w = {1: 4 * w + 12, 2: 2 * w + 14, 3: 16}[stage]  # bytes per param, times w
        n, rest = divmod(gb * 10**9 * w, per_w)
        if not rest and n % w == 0 and 10**9 <= n <= 10**12 and lowest_stage(n, w, gb) == stage:
            return n, w, gb
    raise RuntimeError(f"no exact fit drawn at stage {stage}")  # pragma: no cover


def plan_cases(task: int) -> list[tuple[int, int, int]]:
    """Task 4: nine (n_params, world_size, gpu_GB): one per answer 0-3 and None on several
    GPUs, one GPU that fits and one that does not, two plans that fit exactly."""
    rng = case_rng(task, UNIT)
    cases = [_plan_with(rng, want, WORLD_SIZES) for want in (0, 1, 2, 3, None)]
    cases += [_plan_with(rng, 0, (1,)), _plan_with(rng, None, (1,))]
    cases += [_exact_fit(rng, s) for s in rng.sample((1, 2, 3), 2)]
    rng.shuffle(cases)
    return cases
