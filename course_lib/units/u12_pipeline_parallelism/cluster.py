"""Unit 12's experiments that run under torchrun (``python -m course_lib.cluster list``)."""

from __future__ import annotations

from course_lib import validate
from course_lib.cluster import Experiment


def timelines(
    world_size: int,
    *,
    schedules: tuple = ("naive", "gpipe", "1f1b", "interleaved"),
    microbatches: int = 8,
    width: int = 96,
    seq: int = 32,
    rows: int = 16,
):
    """Per-rank F/B spans of one step per schedule (``unit.run.timelines``); the bubble table
    and the Gantt chart come from ``unit.run.bubble_table`` and ``unit.plots.plot_gantt``."""
    from course_lib.units.u12_pipeline_parallelism import run

    return run.timelines(
        schedules,
        ranks=world_size,
        microbatches=microbatches,
        n_layers=2 * world_size,
        width=width,
        seq=seq,
        rows=rows,
    )


def parity(
    world_size: int,
    *,
    schedules: tuple = ("naive", "gpipe", "1f1b", "interleaved"),
    microbatches: int = 4,
    steps: int = 2,
):
    """Each schedule (ours and torch's) against one process (``unit.run.parity``)."""
    from course_lib.units.u12_pipeline_parallelism import run

    return run.parity(schedules, ranks=world_size, microbatches=microbatches, steps=steps)


def memory(world_size: int, *, schedules: tuple = ("gpipe", "1f1b"), microbatches: int = 8):
    """Peak activation bytes per stage, GPipe vs 1F1B (``unit.run.activation_memory``)."""
    from course_lib.units.u12_pipeline_parallelism import run

    microbatches = validate.count("microbatches", microbatches, minimum=1)  # named as set
    return run.activation_memory(schedules, ranks=world_size, microbatches=microbatches)


def wire(
    world_size: int, *, schedules: tuple = ("gpipe", "1f1b", "interleaved"), microbatches: int = 8
):
    """Messages and bytes between stages per schedule (``unit.run.wire_bytes``)."""
    from course_lib.units.u12_pipeline_parallelism import run

    microbatches = validate.count("microbatches", microbatches, minimum=1)  # named as set
    return run.wire_bytes(schedules, ranks=world_size, microbatches=microbatches)


def _compute_spans(events):
    """The F/B spans each rank ran, in order, without their times (deterministic per schedule)."""
    spans = events[events["lane"] == "compute"]
    keys = ["schedule", "repeat", "rank", "stage", "mb", "kind"]
    return spans[keys].sort_values(keys, kind="stable").reset_index(drop=True)


def _parity_fits(world_size: int, settings: dict) -> None:
    from course_lib.units.u12_pipeline_parallelism import run

    setup = run.Setup()
    for s in settings["schedules"]:
        run._config(s, world_size, settings["microbatches"], 2 if s == "interleaved" else 1, setup)


EXPERIMENTS = [
    Experiment(
        "u12.timelines",
        "per-rank Gantt chart of one step per schedule",
        timelines,
        "notebooks/12_pipeline_parallelism.ipynb",
        plot="unit.plots.plot_gantt(res.value, unit.run.bubble_table(res.value))",
        varying=("start", "end", "duration"),
        canonical=_compute_spans,
    ),
    Experiment(
        "u12.parity",
        "pipeline schedules vs one process on the full batch",
        parity,
        "notebooks/12_pipeline_parallelism.ipynb",
        check=_parity_fits,
    ),
    Experiment(
        "u12.memory",
        "peak activation bytes per stage, GPipe vs 1F1B",
        memory,
        "notebooks/12_pipeline_parallelism.ipynb",
        plot="unit.plots.plot_memory(res.value)",
    ),
    Experiment(
        "u12.wire",
        "messages and bytes between stages per schedule",
        wire,
        "notebooks/12_pipeline_parallelism.ipynb",
    ),
]
