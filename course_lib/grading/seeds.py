"""Where a check's cases come from: a seed per grading, so a copied table or constant fails.

Every check draws the cases it asks about from :func:`case_rng` (sizes, budgets, shapes, which
edge case comes with which numbers). The seed is the one the grade command was given
(``--seed``), else one derived from the learner's id (``--learner``, or the learner's folder in a
batch), carried to the check's process in the environment variable :data:`SEED_ENV`. Without it
(the learner's self-check in their own kernel, nbval on the solutions) the seed is
:data:`DEFAULT_SEED`, so the committed notebooks stay reproducible.

A ✓ line never contains a drawn number (it is compared with the solution's stored line whatever
the seed); ✗ messages may show the drawn case, never its answer.
"""

from __future__ import annotations

import hashlib
import os
import random

__all__ = ["DEFAULT_SEED", "SEED_ENV", "case_rng", "grading_seed", "seed_for_learner"]

SEED_ENV = "COURSE_GRADE_SEED"
DEFAULT_SEED = 0


def grading_seed() -> int:
    """The seed of this grading: ``$COURSE_GRADE_SEED`` if set (a non-negative int), else 0."""
    text = os.environ.get(SEED_ENV, "").strip()
    if not text:
        return DEFAULT_SEED
    try:
        seed = int(text)
    except ValueError:
        raise ValueError(
            f"{SEED_ENV} = {text!r}: expected a non-negative integer (the grading seed)"
        ) from None
    if seed < 0:
        raise ValueError(f"{SEED_ENV} = {seed}: expected a non-negative integer (the grading seed)")
    return seed


def seed_for_learner(learner: str) -> int:
    """A stable seed from a learner's id (the same id always draws the same cases)."""
    if not isinstance(learner, str) or not learner.strip():
        raise ValueError(f"learner = {learner!r}: expected a non-empty string (a learner's id)")
    digest = hashlib.sha256(learner.strip().encode("utf-8")).digest()
    return int.from_bytes(digest[:6], "big")


def case_rng(task: int, unit: str = "") -> random.Random:
    """The random generator a check draws task ``task``'s cases from.

    Independent per (seed, unit, task): adding a draw to one task never changes another's cases.
    ``unit`` is the checks module's unit name (e.g. ``"u05_cpu_offload"``); pass ``__name__``'s
    unit part or leave it empty. For torch tensors, seed a ``torch.Generator`` with
    ``case_rng(task).getrandbits(63)``.
    """
    return random.Random(f"{grading_seed()}:{unit}:{task}")
