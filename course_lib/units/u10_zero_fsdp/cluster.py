"""Unit 10's experiments that run under torchrun (``python -m course_lib.cluster list``)."""
from __future__ import annotations

from course_lib.cluster import Experiment


def parity(world_size: int, *, stages: tuple = (1, 2, 3), steps: int = 3):
    """ZeroDataParallel stages against one process (``unit.run.parity``)."""
    from course_lib.units.u10_zero_fsdp import run
    return run.parity((world_size,), stages, steps=steps)


def memory(world_size: int, *, stages: tuple = (0, 1, 2, 3)):
    """Model-state bytes per rank per stage, measured by MemoryMeter (``unit.run.memory_table``)."""
    from course_lib.units.u10_zero_fsdp import run
    return run.memory_table((world_size,), stages)


def comm(world_size: int, *, stages: tuple = (0, 1, 2, 3), with_torch: bool = True):
    """Bytes on the wire per step per stage, ours and torch's (``unit.run.comm_table``)."""
    from course_lib.units.u10_zero_fsdp import run
    return run.comm_table((world_size,), stages, with_torch=with_torch)


def _rows_divide(world_size: int, settings: dict) -> None:
    rows = 24  # unit.run.batch_fn's global batch
    if rows % world_size:
        valid = ", ".join(str(n) for n in range(2, rows + 1) if rows % n == 0)
        raise ValueError(f"world_size = {world_size}: the global batch of {rows} rows must split "
                         f"evenly; valid: {valid}")


EXPERIMENTS = [
    Experiment("u10.parity", "ZeRO stages 1-3 vs one process on the full batch", parity,
               "notebooks/10_zero_fsdp.ipynb", check=_rows_divide),
    Experiment("u10.memory", "model-state bytes per rank per ZeRO stage (MemoryMeter)", memory,
               "notebooks/10_zero_fsdp.ipynb", plot="unit.plots.plot_memory(res.value)",
               minimum=1),
    Experiment("u10.comm", "bytes on the wire per step per ZeRO stage", comm,
               "notebooks/10_zero_fsdp.ipynb", plot="unit.plots.plot_comm(res.value)"),
]
