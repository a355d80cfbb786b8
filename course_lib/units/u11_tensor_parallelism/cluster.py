"""Unit 11's experiments that run under torchrun (``python -m course_lib.cluster list``)."""

from __future__ import annotations

from course_lib.cluster import Experiment


def parity(world_size: int, *, sequence_parallel: tuple = (False, True), steps: int = 2):
    """The split tiny GPT against one process at tp = world size (``unit.run.parity``)."""
    from course_lib.units.u11_tensor_parallelism import run

    return run.parity((world_size,), sequence_parallel=sequence_parallel, steps=steps)


def memory(world_size: int, *, sequence_parallel: tuple = (False, True)):
    """Bytes per rank by category at tp = world size (``unit.run.memory_per_rank``)."""
    from course_lib.units.u11_tensor_parallelism import run

    return run.memory_per_rank((world_size,), sequence_parallel=sequence_parallel)


def wire(world_size: int, *, sequence_parallel: tuple = (False, True)):
    """Collectives per layer and bytes per rank at tp = world size (``unit.run.wire_bytes``)."""
    from course_lib.units.u11_tensor_parallelism import run

    return run.wire_bytes((world_size,), sequence_parallel=sequence_parallel)


def _tp_fits(world_size: int, settings: dict) -> None:
    from course_lib.parallel.tensor import check_tp
    from course_lib.units.u11_tensor_parallelism import run

    for sp in settings.get("sequence_parallel", (False,)):
        check_tp(run.CONFIG, world_size, sequence_parallel=sp, seq=run.CONFIG.block_size)


EXPERIMENTS = [
    Experiment(
        "u11.parity",
        "tensor-parallel GPT vs one process (tp = world size)",
        parity,
        "notebooks/11_tensor_parallelism.ipynb",
        check=_tp_fits,
        minimum=1,
    ),
    Experiment(
        "u11.memory",
        "memory per rank by category (tp = world size)",
        memory,
        "notebooks/11_tensor_parallelism.ipynb",
        plot="unit.plots.plot_memory(res.value)",
        check=_tp_fits,
        minimum=1,
    ),
    Experiment(
        "u11.wire",
        "collectives and wire bytes per layer (tp = world size)",
        wire,
        "notebooks/11_tensor_parallelism.ipynb",
        check=_tp_fits,
    ),
]
