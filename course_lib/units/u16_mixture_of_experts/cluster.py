"""Unit 16's experiments that run under torchrun (``python -m course_lib.cluster list``)."""

from __future__ import annotations

from course_lib.cluster import Experiment


def parity(world_size: int):
    """Expert parallelism against one process (``unit.run.parity``)."""
    from course_lib.units.u16_mixture_of_experts import run

    return run.parity((world_size,))


EXPERIMENTS = [
    Experiment(
        "u16.parity",
        "expert parallelism vs one process (ep = world size; 8 experts)",
        parity,
        "notebooks/16_mixture_of_experts.ipynb",
        minimum=1,
    ),
]
