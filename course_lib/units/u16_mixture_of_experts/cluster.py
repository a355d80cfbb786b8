"""Unit 16's experiments that run under torchrun (``python -m course_lib.cluster list``)."""

from __future__ import annotations

from course_lib.cluster import Experiment


def parity(world_size: int):
    """Expert parallelism against one process (``unit.run.parity``)."""
    from course_lib.units.u16_mixture_of_experts import run

    return run.parity((world_size,))


def _check(world_size: int, settings: dict) -> None:
    if 8 % world_size:
        raise ValueError(f"world_size = {world_size}: expected a divisor of the 8 experts")


EXPERIMENTS = [
    Experiment(
        "u16.parity",
        "expert parallelism vs one process (ep = world size; 8 experts)",
        parity,
        "notebooks/16_mixture_of_experts.ipynb",
        # float32 rounding of the differences depends on the ranks' thread counts (torchrun
        # sets OMP_NUM_THREADS=1); every other column, "ok" included, must be equal
        varying=("out_max_diff", "dx_max_diff", "grad_max_diff"),
        check=_check,
        minimum=1,
    ),
]
