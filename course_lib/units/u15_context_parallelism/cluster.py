"""Unit 15's experiments that run under torchrun (``python -m course_lib.cluster list``)."""

from __future__ import annotations

from course_lib.cluster import Experiment


def parity(world_size: int, *, causal: tuple = (True, False)):
    """Ring, all-gather K/V and Ulysses against one process (``unit.run.parity``)."""
    from course_lib.units.u15_context_parallelism import run

    return run.parity((world_size,), causal=causal)


EXPERIMENTS = [
    Experiment(
        "u15.parity",
        "ring / all-gather / Ulysses attention vs one process (cp = world size)",
        parity,
        "notebooks/15_context_parallelism.ipynb",
        minimum=1,
    ),
]
