"""Unit 10's experiments that run under torchrun (``python -m course_lib.cluster list``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from course_lib.cluster import Experiment
from course_lib.cluster.experiment import batch_divides

if TYPE_CHECKING:
    import pandas as pd


def parity(world_size: int, *, stages: tuple[int, ...] = (1, 2, 3), steps: int = 3) -> pd.DataFrame:
    """ZeroDataParallel stages against one process (``unit.run.parity``)."""
    from course_lib.units.u10_zero_fsdp import run

    return run.parity((world_size,), stages, steps=steps)


def memory(world_size: int, *, stages: tuple[int, ...] = (0, 1, 2, 3)) -> pd.DataFrame:
    """Model-state bytes per rank per stage, measured by MemoryMeter (``unit.run.memory_table``)."""
    from course_lib.units.u10_zero_fsdp import run

    return run.memory_table((world_size,), stages)


def comm(
    world_size: int, *, stages: tuple[int, ...] = (0, 1, 2, 3), with_torch: bool = True
) -> pd.DataFrame:
    """Bytes on the wire per step per stage, ours and torch's (``unit.run.comm_table``)."""
    from course_lib.units.u10_zero_fsdp import run

    return run.comm_table((world_size,), stages, with_torch=with_torch)


# unit.run.batch_fn's global batch is 24 rows, split over the ranks
_ROWS = batch_divides(24)


EXPERIMENTS = [
    Experiment(
        "u10.parity",
        "ZeRO stages 1-3 vs one process on the full batch",
        parity,
        "notebooks/10_zero_fsdp.ipynb",
        check=_ROWS,
    ),
    Experiment(
        "u10.memory",
        "model-state bytes per rank per ZeRO stage (MemoryMeter)",
        memory,
        "notebooks/10_zero_fsdp.ipynb",
        plot="unit.plots.plot_memory(res.value)",
        minimum=1,
    ),
    Experiment(
        "u10.comm",
        "bytes on the wire per step per ZeRO stage",
        comm,
        "notebooks/10_zero_fsdp.ipynb",
        plot="unit.plots.plot_comm(res.value)",
    ),
]
