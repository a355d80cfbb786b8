"""Unit 09's experiments that run under torchrun (``python -m course_lib.cluster list``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from course_lib.cluster import Experiment
from course_lib.cluster.experiment import batch_divides

if TYPE_CHECKING:
    import pandas as pd


def bytes_per_step(
    world_size: int, *, width: int = 256, bucket_cap_mb: float = 0.25
) -> pd.DataFrame:
    """Gradient all-reduce bytes per step, naive and bucketed (``unit.run.bytes_per_step``)."""
    from course_lib.units.u09_data_parallelism import run

    return run.bytes_per_step((world_size,), width=width, bucket_cap_mb=bucket_cap_mb)


def parity(
    world_size: int, *, steps: int = 3, bucket_cap_mb: float = 0.001, naive: bool = False
) -> pd.DataFrame:
    """DataParallel against one process on the full batch (``unit.run.parity``)."""
    from course_lib.units.u09_data_parallelism import run

    return run.parity((world_size,), steps=steps, bucket_cap_mb=bucket_cap_mb, naive=naive)


def accumulation(
    world_size: int, *, micro_steps: int = 4, bucket_cap_mb: float = 0.001
) -> pd.DataFrame:
    """All-reduces and bytes with and without ``no_sync`` (``unit.run.accumulation_traffic``)."""
    from course_lib.units.u09_data_parallelism import run

    return run.accumulation_traffic(
        world_size=world_size, micro_steps=micro_steps, bucket_cap_mb=bucket_cap_mb
    )


# unit.run.batch_fn's global batch is 24 rows, split over the ranks
_ROWS = batch_divides(24)


EXPERIMENTS = [
    Experiment(
        "u09.bytes",
        "gradient all-reduce bytes per step, naive and bucketed",
        bytes_per_step,
        "notebooks/09_data_parallelism.ipynb",
        plot="unit.plots.plot_bytes(res.value)",
    ),
    Experiment(
        "u09.parity",
        "DataParallel vs one process on the full batch",
        parity,
        "notebooks/09_data_parallelism.ipynb",
        check=_ROWS,
        minimum=1,
    ),
    Experiment(
        "u09.accumulation",
        "gradient accumulation with and without no_sync",
        accumulation,
        "notebooks/09_data_parallelism.ipynb",
        check=_ROWS,
    ),
]
