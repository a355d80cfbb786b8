"""Unit 18's experiments that run under torchrun (``python -m course_lib.cluster list``)."""

from __future__ import annotations

from course_lib.cluster import Experiment


def elastic(
    world_size: int,
    *,
    steps: int = 12,
    every: int = 4,
    kill_step: int = -1,
    kill_rank: int = 1,
    root: str = "",
    slow_rank: int = -1,
    slow_s: float = 0.0,
):
    """The unit's sharded MLP saving every ``every`` steps and resuming from the latest
    checkpoint in ``root``; under torchrun, rank ``kill_rank`` dies after ``kill_step`` in the
    first attempt (``unit.run.elastic_run``)."""
    from course_lib.units.u18_failures_and_checkpoints import run

    return run.elastic_run(
        world_size,
        steps=steps,
        every=every,
        kill_step=kill_step,
        kill_rank=kill_rank,
        root=root,
        slow_rank=slow_rank,
        slow_s=slow_s,
    )


EXPERIMENTS = [
    Experiment(
        "u18.elastic",
        "A sharded run that checkpoints, loses a rank and resumes under torchrun --max-restarts",
        elastic,
        "notebooks/18_failures_and_checkpoints.ipynb",
        plot="unit.plots.plot_losses(res.value)",
    ),
]
