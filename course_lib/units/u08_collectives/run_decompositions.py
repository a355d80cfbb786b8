"""Unit 08, section 2: the worked example and the two decompositions of all-reduce.

Used by notebooks/08_collectives.ipynb through :mod:`run` (which re-exports these names).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import pandas as pd
import torch
import torch.distributed as dist

from course_lib import kit, validate
from course_lib.parallel import collectives as C
from course_lib.runtime import compat
from course_lib.units.u08_collectives._primitives import (
    WORKED_EXAMPLE_GRADS,
    _launch,
)

# sections 9-11 (what collectives mean for training) and the held-out fit
# sections 4 (time) and 5 (wire bytes of every collective) live in their own files; one name here


# --------------------------------------------------------------------------------------------
# 2. the worked example and the two decompositions of all-reduce
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class WorkedExampleRow:
    """One rank of :func:`worked_example`: its gradient, the mean four ways, the SGD step."""

    rank: int
    grad: float
    all_reduce: float = field(metadata=kit.column("mean via all_reduce"))
    reduce_broadcast: float = field(metadata=kit.column("mean via reduce+broadcast"))
    rs_ag: float = field(metadata=kit.column("mean via reduce_scatter+all_gather"))
    ring: float = field(metadata=kit.column("mean via ring (from scratch)"))
    sgd_step: float = field(metadata=kit.column("sgd step"))
    new_weight: float = field(metadata=kit.column("new weight"))


def _worked_example_worker(
    rank: int, world_size: int, grads: Sequence[float], lr: float, weight: float
) -> WorkedExampleRow:
    n = world_size
    g = torch.tensor([grads[rank]], dtype=torch.float64)  # (1,) this worker's gradient

    via_all_reduce = g.clone()
    dist.all_reduce(via_all_reduce)

    via_reduce_broadcast = g.clone()
    dist.reduce(via_reduce_broadcast, dst=0)
    dist.broadcast(via_reduce_broadcast, src=0)

    # reduce-scatter needs a size divisible by N: pad with zeros, as FSDP pads its flat parameters
    padded = torch.zeros(n, dtype=torch.float64)  # (N,)
    padded[0] = g
    shard = torch.empty(1, dtype=torch.float64)
    full = torch.empty(n, dtype=torch.float64)
    compat.reduce_scatter_single(shard, padded)
    compat.all_gather_single(full, shard)
    via_rs_ag = full[:1]

    via_ring = C.ring_all_reduce(g.clone())
    vias = (via_all_reduce, via_reduce_broadcast, via_rs_ag, via_ring)
    ar, rb, rs_ag, ring = (float(v.item()) / n for v in vias)
    return WorkedExampleRow(rank, float(g.item()), ar, rb, rs_ag, ring, -lr * ar, weight - lr * ar)


def worked_example(
    grads: Sequence[float] = WORKED_EXAMPLE_GRADS,
    *,
    lr: float = 1e-3,
    weight: float = 1.0,
    timeout: float = 60.0,
) -> pd.DataFrame:
    """Data-parallel SGD on one weight: each rank has one gradient; average them four ways.

    One row per rank: its gradient, the mean computed by all_reduce, by reduce + broadcast, by
    reduce-scatter + all-gather and by our ring (each divided by N), the SGD step -lr * mean and
    the updated weight. float64, so the four means agree to the last bit or nearly.
    """
    grads = [float(g) for g in grads]
    world_size = validate.count("len(grads)", len(grads), minimum=1, maximum=16)
    rows = _launch(_worked_example_worker, world_size, grads, lr, weight, timeout=timeout)
    return kit.frame(rows, WorkedExampleRow).set_index("rank")


def _padded(x: torch.Tensor, n: int) -> torch.Tensor:
    """``x`` with zeros after it, to a multiple of ``n`` elements: (N*k,)."""
    padded = torch.zeros(math.ceil(x.numel() / n) * n)
    padded[: x.numel()] = x
    return padded


def _all_reduce_methods(
    x: torch.Tensor, padded: torch.Tensor, shard: torch.Tensor, n: int
) -> list[tuple[str, torch.Tensor]]:
    """Every way of the lecture to all-reduce ``x``: (method, this rank's result)."""
    numel = x.numel()
    rb = x.clone()
    dist.reduce(rb, dst=0)
    dist.broadcast(rb, src=0)
    full = torch.empty(padded.numel())
    compat.all_gather_single(full, shard)
    shard2, full2 = torch.empty(shard.numel()), torch.empty(padded.numel())
    C.ring_reduce_scatter(shard2, padded)
    C.ring_all_gather(full2, shard2)
    methods = [
        ("reduce+broadcast", rb),
        ("reduce_scatter+all_gather", full[:numel]),
        ("ring reduce_scatter+all_gather (from scratch)", full2[:numel]),
        ("ring all_reduce (from scratch)", C.ring_all_reduce(x.clone())),
        ("naive ring all_reduce (from scratch)", C.naive_ring_all_reduce(x.clone())),
        ("reduce+broadcast (from scratch)", C.reduce_broadcast_all_reduce(x.clone())),
    ]
    if n & (n - 1) == 0:  # recursive doubling needs a power-of-two world size
        methods.append(
            ("recursive doubling (from scratch)", C.recursive_doubling_all_reduce(x.clone()))
        )
    return methods


@dataclass(frozen=True)
class DecompositionRow:
    """One rank and method of :func:`all_reduce_decompositions`."""

    rank: int
    method: str
    compared_with: str = field(metadata=kit.column("compared with"))
    max_abs_difference: float = field(metadata=kit.column("max abs difference"))
    bitwise_equal: bool = field(metadata=kit.column("bitwise equal"))
    summation_bound: float = field(metadata=kit.column("summation bound"))


def _decomposition_worker(
    rank: int, world_size: int, numel: int, seed: int
) -> list[DecompositionRow]:
    n = world_size
    gen = torch.Generator().manual_seed(seed + rank)
    x = torch.randn(numel, generator=gen)  # (S,) this rank's "gradient"
    reference = x.clone()
    dist.all_reduce(reference)
    padded = _padded(x, n)  # (N*k,)
    shard = torch.empty(padded.numel() // n)  # (k,)
    compat.reduce_scatter_single(shard, padded)
    # (method, its result, torch.distributed's result for the same input, the reference's name)
    checks = [
        (m, got, reference, "all_reduce") for m, got in _all_reduce_methods(x, padded, shard, n)
    ]
    abs_sum = x.abs()
    dist.all_reduce(abs_sum)
    bound = float(((n - 1) * torch.finfo(x.dtype).eps * abs_sum).max())
    shard3 = torch.empty(padded.numel() // n)
    C.ring_reduce_scatter(shard3, padded)
    checks.append(("ring reduce_scatter (from scratch)", shard3, shard, "reduce_scatter_tensor"))
    full, full3 = torch.empty(padded.numel()), torch.empty(padded.numel())
    compat.all_gather_single(full, shard)
    C.ring_all_gather(full3, shard)  # the same input as torch's all-gather
    checks.append(("ring all_gather (from scratch)", full3, full, "all_gather_into_tensor"))
    return [
        DecompositionRow(
            rank,
            method,
            f"dist.{ref_name}",
            float((got - want).abs().max()),
            bool(torch.equal(got, want)),
            bound,
        )
        for method, got, want, ref_name in checks
    ]


def all_reduce_decompositions(
    world_size: int = 4, numel: int = 1001, *, seed: int = 0, timeout: float = 60.0
) -> pd.DataFrame:
    """all_reduce = reduce + broadcast = reduce_scatter + all_gather, checked on random data, and
    every from-scratch collective of course_lib.parallel.collectives against torch.distributed.

    One row per (rank, method): the largest difference from the torch.distributed collective named
    in ``compared with`` (``dist.all_reduce`` for every all-reduce) and whether it is bitwise equal. ``summation bound`` is (N-1) eps max_i sum_r |x_r,i|, how far two valid
    summation orders may drift apart in float32 (Higham 2002, section 4.2).
    """
    world_size = validate.count("world_size", world_size, minimum=1, maximum=16)
    per_rank = _launch(_decomposition_worker, world_size, int(numel), int(seed), timeout=timeout)
    return kit.frame(kit.rows_of(per_rank, DecompositionRow), DecompositionRow)
