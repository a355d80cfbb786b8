"""Measured runs of unit 08 (collectives): what the ranks hold, how many bytes move, how long it takes.

Used by notebooks/08_collectives.ipynb, its widget and its exercise checks. Every function here
launches real processes with :func:`course_lib.launch` (gloo on CPU) and returns plain data:
tensors the ranks returned, or tidy pandas DataFrames. Predictions come from
:mod:`course_lib.measure.estimate`; bytes from :class:`course_lib.measure.comm.CommMeter`, which
counts the payload handed to every call and measures what the process wrote to its sockets (the
wire). The wire bytes of every collective at a size where headers do not matter are measured in
:mod:`course_lib.units.u08_collectives.run_wire`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch
import torch.distributed as dist

from course_lib import kit, validate
from course_lib.parallel import collectives as C
from course_lib.units.u08_collectives._primitives import (
    ALGORITHMS,
    BYTE_EXPERIMENTS,
    COLLECTIVE_CHOICES,
    PRIMITIVES,
    TIMED,
    WORKED_EXAMPLE_GRADS,
    _empty,
    _launch,
    _meter,
    _only,
    _row,
    _run_primitive,
    estimated_bytes_sent,
    payload_bytes,
    piece_value,
    predicted_bytes_sent,
)
from course_lib.units.u08_collectives.run_decompositions import (  # noqa: F401 (re-exported)
    all_reduce_decompositions,
    worked_example,
)

# sections 9-11 (what collectives mean for training) and the held-out fit
from course_lib.units.u08_collectives.run_patterns import (
    CONFUSION_GRADS,
    algorithm_comparison,
    confusion_example,
    heldout_crossover,
    lost_rank,
    straggler,
)

# sections 4 (time) and 5 (wire bytes of every collective) live in their own files; one name here
from course_lib.units.u08_collectives.run_timing import (
    compare_with_model,
    fit_per_message_alpha_beta,
    measured_crossover_bytes,
    model_crossover_bytes,
    model_curves,
    time_all_reduce,
)
from course_lib.units.u08_collectives.run_wire import (
    WIRE_SIZE_BYTES,
    measure_wire_bytes,
    ratio_table,
)

__all__ = [
    "ALGORITHMS",
    "BYTE_EXPERIMENTS",
    "COLLECTIVE_CHOICES",
    "PRIMITIVES",
    "TIMED",
    "WIRE_SIZE_BYTES",
    "WORKED_EXAMPLE_GRADS",
    "all_reduce_decompositions",
    "bytes_table",
    "compare_with_model",
    "estimated_bytes_sent",
    "expected_after",
    "fit_per_message_alpha_beta",
    "measure_bytes",
    "measure_wire_bytes",
    "measured_crossover_bytes",
    "model_crossover_bytes",
    "model_curves",
    "payload_bytes",
    "piece_value",
    "predicted_bytes_sent",
    "ratio_table",
    "run_primitives",
    "time_all_reduce",
    "worked_example",
    "CONFUSION_GRADS",
    "algorithm_comparison",
    "confusion_example",
    "heldout_crossover",
    "lost_rank",
    "straggler",
]

# --------------------------------------------------------------------------------------------
# 1. the eight primitives: before / after on every rank
# --------------------------------------------------------------------------------------------


def _primitives_worker(
    rank: int, world_size: int, names: Sequence[str], root: int
) -> dict[str, dict[str, Any]]:
    results: dict[str, dict[str, Any]] = {}
    for name in names:
        dist.barrier()  # no rank starts the next primitive while another is still in the last one
        with _meter() as meter:
            before, after = _run_primitive(name, rank, world_size, root)
        results[name] = {
            "before": before,
            "after": after,
            "calls": dict(meter.calls),
            "wire_bytes_sent": meter.wire_bytes_sent,
            "model_bytes_sent": meter.model_bytes_sent,
            "wire_source": meter.wire_source,
        }
    return results


def run_primitives(
    names: Sequence[str] = PRIMITIVES, world_size: int = 4, *, root: int = 0, timeout: float = 60.0
) -> dict[str, dict[str, Any]]:
    """Run each named collective once on ``world_size`` real ranks (one launch for all).

    Returns ``{name: {"before": [row per rank], "after": [row per rank], "calls": [dict per
    rank], "wire_bytes_sent": [...], "model_bytes_sent": [...], "wire_source": [...]}}`` where a
    row is an N-slot float tensor (NaN = the rank holds nothing there); ``wire_bytes_sent`` is
    measured by CommMeter (what the rank wrote to its sockets, None where the OS cannot see it),
    ``model_bytes_sent`` is estimate's figure as CommMeter applies it. With one float per slot the
    payloads are a few bytes, so the wire is mostly message headers here.
    ``names``: any of :data:`COLLECTIVE_CHOICES`.
    """
    names = [names] if isinstance(names, str) else list(names)
    for name in names:
        validate.choice("names[i]", name, COLLECTIVE_CHOICES)
    world_size = validate.count("world_size", world_size, minimum=1, maximum=10)
    if "recursive_doubling (from scratch)" in names:
        validate.power_of_two(
            "world_size", world_size, maximum=8, note="recursive doubling needs one"
        )
    root = validate.count("root", root, minimum=0, maximum=world_size - 1)
    per_rank = _launch(_primitives_worker, world_size, names, root, timeout=timeout)
    # one list per key of the workers' results ("before", "after", "calls", ...), in rank order
    return {
        name: {k: [res[name][k] for res in per_rank] for k in per_rank[0][name]} for name in names
    }


@dataclass(frozen=True)
class PrimitiveBytesRow:
    """One rank of :func:`bytes_table` (bytes)."""

    rank: int
    calls: str
    predicted: float | None = field(metadata=kit.column("sent, predicted (estimate)"))
    wire: int | None = field(metadata=kit.column("sent, measured (wire)"))
    residual: float | None = field(metadata=kit.column("residual (wire - predicted)"))


def bytes_table(
    name: str, result: dict[str, Any], world_size: int, *, root: int = 0
) -> pd.DataFrame:
    """Per-rank bytes of one run_primitives result (run with ``root``): predicted by estimate,
    measured on the wire (CommMeter), and the residual (wire - predicted; None if unmeasured)."""
    rows = []
    for rank in range(world_size):
        predicted = estimated_bytes_sent(name, world_size, rank, root=root)
        wire = result["wire_bytes_sent"][rank]
        calls = ", ".join(f"{op} x{k}" for op, k in sorted(result["calls"][rank].items()))
        residual = None if wire is None or predicted is None else wire - predicted
        rows.append(PrimitiveBytesRow(rank, calls, predicted, wire, residual))
    return kit.frame(rows, PrimitiveBytesRow).set_index("rank")


def expected_after(name: str, world_size: int, *, root: int = 0) -> list[torch.Tensor]:
    """What every rank should hold after ``name``, computed in one process from the definition.

    Used by tests and by the notebook's check cell (the ranks' real output must equal this).
    """
    validate.choice("name", name, COLLECTIVE_CHOICES)
    n = world_size
    rows = torch.stack([_row(r, n) for r in range(n)])  # (rank, slot)
    total = rows.sum(0)  # (slot,)
    if name == "broadcast":
        return [rows[root].clone() for _ in range(n)]
    if name == "scatter":
        return [_only(r, rows[root, r], n) for r in range(n)]
    if name == "gather":
        return [rows.diagonal().clone() if r == root else _empty(n) for r in range(n)]
    if name == "reduce":
        return [total.clone() if r == root else _empty(n) for r in range(n)]
    if name in ("all_reduce",) or name.endswith("(from scratch)"):
        return [total.clone() for _ in range(n)]
    if name == "all_gather":
        return [rows.diagonal().clone() for _ in range(n)]
    if name == "reduce_scatter":
        return [_only(r, total[r], n) for r in range(n)]
    return [rows[:, r].clone() for r in range(n)]  # all_to_all: rank r gets column r


# --------------------------------------------------------------------------------------------
# 3. bytes of the from-scratch algorithms: predicted by estimate, counted and measured by CommMeter
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class AlgorithmBytesRow:
    """One algorithm and rank of :func:`measure_bytes` (bytes)."""

    algorithm: str
    rank: int
    size_bytes: int
    predicted_bytes_sent: float
    payload_sent: int
    wire_bytes_sent: int | None
    residual: float | None
    payload_received: int
    p2p_calls: int


def _bytes_worker(
    rank: int, world_size: int, algorithms: Sequence[str], numel: int, dtype: torch.dtype
) -> list[AlgorithmBytesRow]:
    rows = []
    for algorithm in algorithms:
        x = torch.randn(numel, dtype=dtype)  # (S,)
        dist.barrier()
        with _meter() as meter:
            if algorithm == "reduce_scatter+all_gather":
                shard = torch.empty(numel // world_size, dtype=dtype)
                C.ring_reduce_scatter(shard, x)
                C.ring_all_gather(x, shard)
            else:
                C.ALL_REDUCE_ALGORITHMS[algorithm](x)
        size, wire = x.numel() * x.element_size(), meter.wire_bytes_sent
        predicted = predicted_bytes_sent(algorithm, size, world_size, rank)
        rows.append(
            AlgorithmBytesRow(
                algorithm=algorithm,
                rank=rank,
                size_bytes=size,
                predicted_bytes_sent=predicted,
                payload_sent=int(meter.model_bytes_sent),
                wire_bytes_sent=wire,
                residual=None if wire is None else wire - predicted,
                payload_received=int(meter.model_bytes_received),
                p2p_calls=sum(meter.calls.values()),
            )
        )
    return rows


def measure_bytes(
    world_size: int = 4,
    numel: int = 4 * 1024,
    *,
    algorithms: Sequence[str] = BYTE_EXPERIMENTS,
    dtype: torch.dtype = torch.float32,
    timeout: float = 60.0,
) -> pd.DataFrame:
    """Bytes each rank sends in each from-scratch algorithm: predicted, counted and measured.

    One row per (algorithm, rank): ``size_bytes`` (S); ``payload_sent`` / ``payload_received``,
    the tensors the algorithm handed to isend / irecv (counted by CommMeter from the calls);
    ``wire_bytes_sent``, what the rank wrote to its sockets (measured by CommMeter through the
    OS; None where it cannot see them); ``predicted_bytes_sent`` (estimate); ``residual`` (wire -
    predicted: gloo's message headers) and ``p2p_calls``. ``numel`` must be a multiple of
    ``world_size`` so that the ring's chunks are even and the formulas are exact (uneven sizes
    are covered by ``collectives.ring_all_reduce_elements_sent``).
    """
    world_size = validate.count("world_size", world_size, minimum=1, maximum=16)
    algorithms = [validate.choice("algorithms[i]", a, BYTE_EXPERIMENTS) for a in algorithms]
    validate.divisible("numel", numel, "world_size", world_size, note="so the formulas are exact")
    if "recursive_doubling" in algorithms:
        validate.power_of_two(
            "world_size", world_size, maximum=16, note="recursive doubling needs one"
        )
    per_rank = _launch(_bytes_worker, world_size, algorithms, int(numel), dtype, timeout=timeout)
    df = kit.frame(kit.rows_of(per_rank, AlgorithmBytesRow), AlgorithmBytesRow)
    return df.sort_values(
        ["algorithm", "rank"],
        key=lambda c: (
            c.map({a: i for i, a in enumerate(algorithms)}) if c.name == "algorithm" else c
        ),
    ).reset_index(drop=True)
