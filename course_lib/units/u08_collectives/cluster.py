"""Unit 08's experiments that run under torchrun (``python -m course_lib.cluster list``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from course_lib import validate
from course_lib.cluster import Experiment

if TYPE_CHECKING:
    import pandas as pd


def timing(
    world_size: int,
    *,
    sizes_bytes: tuple[int, ...] = (4 * 2**10, 256 * 2**10, 4 * 2**20),
    algorithms: tuple[str, ...] = ("ring", "recursive_doubling", "gloo"),
    repeats: int = 5,
    warmup: int = 1,
) -> pd.DataFrame:
    """The lecture's all-reduce timing sweep (``unit.run.time_all_reduce``)."""
    from course_lib.units.u08_collectives import run

    return run.time_all_reduce(
        list(sizes_bytes),
        world_size=world_size,
        algorithms=algorithms,
        repeats=repeats,
        warmup=warmup,
        progress=False,
    )


def bytes_sent(world_size: int, *, numel: int = 4096) -> pd.DataFrame:
    """Bytes each rank hands to send/recv per algorithm (``unit.run.measure_bytes``)."""
    from course_lib.units.u08_collectives import run

    return run.measure_bytes(world_size, numel=numel)


def wire(world_size: int, *, size_bytes: int = 4 * 2**20) -> pd.DataFrame:
    """Bytes each rank wrote to its sockets per collective (``unit.run.measure_wire_bytes``)."""
    from course_lib.units.u08_collectives import run

    return run.measure_wire_bytes(world_size, size_bytes)


def _power_of_two(world_size: int, settings: dict[str, Any]) -> None:
    if "recursive_doubling" in settings.get("algorithms", ()):
        validate.power_of_two(
            "world_size",
            world_size,
            minimum=2,
            note="recursive_doubling needs one; drop it from algorithms for other sizes",
        )


EXPERIMENTS = [
    Experiment(
        "u08.timing",
        "all-reduce time per algorithm and message size",
        timing,
        "notebooks/08_collectives.ipynb",
        plot="unit.plots.plot_times(res.value)",
        varying=("median_s", "p25_s", "p75_s"),
        check=_power_of_two,
    ),
    Experiment(
        "u08.bytes",
        "bytes each rank sends per all-reduce algorithm",
        bytes_sent,
        "notebooks/08_collectives.ipynb",
        plot="unit.plots.plot_bytes(res.value)",
    ),
    Experiment(
        "u08.wire",
        "bytes on the wire per collective, beside estimate",
        wire,
        "notebooks/08_collectives.ipynb",
        plot="unit.run.ratio_table(res.value)",
    ),
]
