"""Unit 17's experiments that run under torchrun (``python -m course_lib.cluster list``)."""

from __future__ import annotations

from course_lib.cluster import Experiment


def allgather(world_size: int, *, gathers: tuple = ("fp32", "bf16", "fp8"), steps: int = 2):
    """ZeRO-3 all-gathers in fp32, bf16 and FP8 on ``world_size`` ranks
    (``unit.run.allgather_bytes``)."""
    from course_lib.units.u17_fp8_training import run

    return run.allgather_bytes(world_size, gathers=gathers, steps=steps)


EXPERIMENTS = [
    Experiment(
        "u17.allgather",
        "FSDP all-gather bytes with fp32, bf16 and FP8 weights",
        allgather,
        "notebooks/17_fp8_training.ipynb",
        plot="unit.plots.plot_allgather(unit.run.allgather_summary(res.value))",
        varying=("wire_sent",),  # bytes the OS saw: headers may differ between launchers
    ),
]
