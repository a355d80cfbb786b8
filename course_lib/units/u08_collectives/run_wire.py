"""Bytes every collective puts on the wire, beside what estimate predicts (unit 08).

Used by notebooks/08_collectives.ipynb (section 5) and its tests. Each of the eight
torch.distributed primitives and each from-scratch all-reduce runs once on real gloo ranks with a
tensor of S bytes, large enough (MiBs) that gloo's message headers are a small fraction of it; a
CommMeter around each call reads what the rank wrote to its sockets (``/proc/self/io`` wchar, see
:mod:`course_lib.measure.wire`). The prediction is ``estimate``'s bandwidth-optimal figure, so
the residual (wire - predicted) is the difference between the algorithm the library really ran
and the one the course's formula assumes, plus headers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd
import torch.distributed as dist

from course_lib import kit, validate
from course_lib.units.u08_collectives._primitives import (
    COLLECTIVE_CHOICES,
    _launch,
    _meter,
    _run_primitive,
    estimated_bytes_sent,
)

__all__ = ["WIRE_SIZE_BYTES", "measure_wire_bytes", "ratio_table"]

#: default S: 4 MiB, where headers stay below 0.2 % of S for every collective on 2-8 ranks
WIRE_SIZE_BYTES = 4 * 2**20


@dataclass(frozen=True)
class WireRow:
    """One collective and rank of :func:`measure_wire_bytes`: bytes, and the same in units of S."""

    collective: str
    rank: int
    size_bytes: int
    predicted_bytes_sent: float | None
    wire_bytes_sent: int | None
    residual: float | None
    predicted_S: float
    wire_S: float
    residual_S: float
    wire_source: str


def _wire_worker(
    rank: int, world_size: int, names: Sequence[str], root: int, k: int
) -> list[WireRow]:
    size = 4 * world_size * k  # S
    rows = []
    for name in names:
        dist.barrier()  # nobody is still writing the previous collective's bytes
        with _meter() as meter:
            _run_primitive(name, rank, world_size, root, k)
        wire = meter.wire_bytes_sent
        pred = estimated_bytes_sent(name, world_size, rank, root=root, k=k)
        residual = None if wire is None or pred is None else wire - pred
        rows.append(
            WireRow(
                collective=name,
                rank=rank,
                size_bytes=size,
                predicted_bytes_sent=pred,
                wire_bytes_sent=wire,
                residual=residual,
                predicted_S=math.nan if pred is None else pred / size,
                wire_S=math.nan if wire is None else wire / size,
                residual_S=math.nan if residual is None else residual / size,
                wire_source=meter.wire_source,
            )
        )
    return rows


def _wire_names(names: Sequence[str] | str | None, world_size: int) -> list[str]:
    """The collectives to measure (default: all that ``world_size`` allows), checked."""
    power_of_two = world_size & (world_size - 1) == 0
    if names is None:
        names = [n for n in COLLECTIVE_CHOICES if power_of_two or not n.startswith("recursive")]
    names = validate.choices("names", names, COLLECTIVE_CHOICES)
    if "recursive_doubling (from scratch)" in names:
        validate.power_of_two(
            "world_size", world_size, minimum=2, maximum=8, note="for recursive doubling"
        )
    return names


def measure_wire_bytes(
    world_size: int = 4,
    size_bytes: int = WIRE_SIZE_BYTES,
    *,
    names: Sequence[str] | None = None,
    root: int = 0,
    timeout: float = 120.0,
) -> pd.DataFrame:
    """Run each collective once on ``world_size`` gloo ranks with S = ``size_bytes`` and return
    what each rank sent on the wire beside estimate's prediction.

    ``names``: any of ``run.COLLECTIVE_CHOICES`` (default: all of them, without recursive
    doubling when ``world_size`` is not a power of two). S follows estimate's conventions: the
    tensor for broadcast, reduce, all_reduce and the from-scratch all-reduces; the root's buffer
    for scatter and gather; the output for all_gather (each rank contributes S/N); the input for
    reduce_scatter and all_to_all. ``size_bytes`` must be a multiple of 4 * ``world_size``
    (float32 slots of equal size).

    One row per (collective, rank): ``size_bytes``, ``predicted_bytes_sent`` (estimate),
    ``wire_bytes_sent`` (measured; None where the OS cannot see the traffic), ``residual`` (wire
    - predicted), the same three divided by S (``predicted_S``, ``wire_S``, ``residual_S``) and
    ``wire_source``.
    """
    world_size = validate.count("world_size", world_size, minimum=2, maximum=8)
    names = _wire_names(names, world_size)
    size_bytes = validate.count("size_bytes", size_bytes, minimum=1)
    validate.divisible(
        "size_bytes",
        size_bytes,
        "4 * world_size",
        4 * world_size,
        note="float32 slots, one per rank",
    )
    root = validate.count("root", root, minimum=0, maximum=world_size - 1)
    k = size_bytes // (4 * world_size)
    per_rank = _launch(_wire_worker, world_size, names, root, k, timeout=timeout)
    df = kit.frame(kit.rows_of(per_rank, WireRow), WireRow)
    order = {name: i for i, name in enumerate(names)}
    return df.sort_values(
        ["collective", "rank"], key=lambda c: c.map(order) if c.name == "collective" else c
    ).reset_index(drop=True)


def ratio_table(df: pd.DataFrame) -> pd.DataFrame:
    """One row per collective: predicted and measured bytes sent by each rank, in multiples of S
    (columns ``("predicted / S", rank)`` and ``("wire / S", rank)``), in the order of ``df``."""
    order = list(dict.fromkeys(df["collective"]))
    wide = df.pivot(index="collective", columns="rank", values=["predicted_S", "wire_S"]).loc[order]
    return wide.rename(columns={"predicted_S": "predicted / S", "wire_S": "wire / S"}, level=0)
