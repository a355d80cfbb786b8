"""Unit 17, bytes: the course's ZeRO-3 gathering fp32, bf16 or FP8 weights on real gloo ranks,
measured on the wire (CommMeter) and in the tensors each rank holds, beside the estimates.

Used by notebooks/17_fp8_training.ipynb through :mod:`run` (which re-exports these names).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pandas as pd
import torch

from course_lib import kit, validate
from course_lib.measure import estimate
from course_lib.units.u17_fp8_training._setup import BLOCK, batch_fn, model_fn

GATHERS = ("fp32", "bf16", "fp8")


@dataclass(frozen=True)
class GatherRow:
    """:func:`allgather_bytes`: one collective family of one rank's measured step."""

    rank: int
    gather: str
    op: str
    calls: int
    payload_bytes: int
    model_sent: float
    wire_sent: int | None
    loss: float
    state_bytes: int
    largest_gather_bytes: int
    numel_linear: int
    numel_other: int
    numel_largest: int


def _state_bytes(model) -> int:
    """fp32 shards, their gradients and the optimizer's tensors this rank holds, in bytes."""
    total = 0
    for p in model.optimizer.param_groups[0]["params"]:
        total += p.numel() * p.element_size()
        total += 0 if p.grad is None else p.grad.numel() * p.grad.element_size()
        for t in model.optimizer.state.get(p, {}).values():
            if isinstance(t, torch.Tensor) and t.dim() > 0:
                total += t.numel() * t.element_size()
    return total


def _gather_worker(
    rank: int, world_size: int, gathers: Sequence[str], steps: int
) -> list[GatherRow]:
    import torch.distributed as dist

    from course_lib.measure.comm import CommMeter, collective_family
    from course_lib.parallel.zero.fp8 import LowPrecisionGatherSharded, gathered_numels
    from course_lib.techniques.fp8_linear import convert_to_float8

    rows = []
    for gather in gathers:
        model = model_fn(0)
        if gather == "fp8":  # the layers compute in FP8 too, tensorwise like the gather
            convert_to_float8(model, recipe="tensorwise", block=BLOCK)
        fsdp = LowPrecisionGatherSharded(model, gather=gather, lr=3e-3)
        gen = torch.Generator().manual_seed(1)
        for _ in range(steps):  # the last step is measured; the first warms gloo up
            idx, tgt = batch_fn(gen)
            dist.barrier()
            with CommMeter(dispatch=False) as comm:
                loss = _loss(fsdp, idx, tgt)
                loss.backward()
            fsdp.step()
            state = _state_bytes(fsdp)  # shards, their gradients, Adam's moments
            fsdp.zero_grad()
        numels = gathered_numels(fsdp)
        for op in comm.calls:
            recs = [r for r in comm.records if r["op"] == op]
            wire = [r["wire_sent"] for r in recs]
            rows.append(GatherRow(
                rank, gather, collective_family(op), len(recs),
                payload_bytes=sum(r["bytes"] for r in recs),
                model_sent=float(sum(r["model_sent"] for r in recs)),
                wire_sent=None if None in wire else int(sum(wire)),
                loss=float(loss.detach()), state_bytes=state,
                largest_gather_bytes=fsdp.largest_gather_bytes, numel_linear=numels["linear"],
                numel_other=numels["other"], numel_largest=numels["largest"],
            ))  # fmt: skip
    return rows


def _loss(fsdp, idx, tgt):
    import torch.nn.functional as F

    logits = fsdp(idx)  # through the wrapper: its saved-tensor hooks keep tickets, not weights
    return F.cross_entropy(logits.flatten(0, 1), tgt.flatten())


def allgather_bytes(
    world_size: int = 4, *, gathers: Sequence[str] = GATHERS, steps: int = 2, timeout: float = 120.0
) -> pd.DataFrame:
    """One training step of the unit's GPT under the course's ZeRO-3 on ``world_size`` gloo
    ranks, its all-gathers carrying fp32, bf16, or FP8 (linear weights; the rest bf16). One row
    per rank, gather and collective: calls, payload bytes, the ring model's bytes and the bytes
    the rank wrote to its sockets (MEASURED, /proc/self/io), the loss, the state bytes held and
    the largest gathered buffer."""
    n = validate.count("world_size", world_size, minimum=2)
    names = validate.choices("gathers", gathers, GATHERS)
    steps = validate.count("steps", steps, minimum=2)
    config = dict(gathers=names, steps=steps)
    return kit.sweep(_gather_worker, [config], GatherRow, world_size=n, timeout=timeout)


@dataclass(frozen=True)
class GatherSummaryRow:
    """:func:`allgather_summary`: rank 0's all-gather bytes per step for one gather."""

    gather: str
    all_gathers: int = field(metadata=kit.column("all-gathers"))
    predicted: float
    ring_model: float = field(metadata=kit.column("ring model of the calls"))
    wire: int | None = field(metadata=kit.column("wire (measured)"))
    wire_over_predicted: float | None = field(metadata=kit.column("wire / predicted"))
    amax_all_reduces: int = field(metadata=kit.column("amax all-reduces"))
    amax_wire: int = field(metadata=kit.column("amax wire (measured)"))


@dataclass(frozen=True)
class MemorySummaryRow:
    """:func:`memory_summary`: rank 0's state bytes and largest gather for one gather."""

    gather: str
    state_measured: int = field(metadata=kit.column("state bytes (measured)"))
    state_predicted: float = field(metadata=kit.column("state bytes (predicted)"))
    largest_measured: int = field(metadata=kit.column("largest gather (measured)"))
    largest_predicted: float = field(metadata=kit.column("largest gather (predicted)"))


@dataclass(frozen=True)
class CacheRow:
    """:func:`weight_cache_bytes`: the FP8 weight cache of one scaling beside the masters."""

    scaling: str
    masters: int = field(metadata=kit.column("fp32 masters (B)"))
    measured: int = field(metadata=kit.column("FP8 cache, measured (B)"))
    predicted: int = field(metadata=kit.column("FP8 cache, predicted (B)"))
    ratio: float = field(metadata=kit.column("cache / masters"))


def allgather_summary(df: pd.DataFrame) -> pd.DataFrame:
    """Rank 0's all-gather bytes per step for each gather: predicted
    (``estimate.fsdp_allgather_bytes_sent`` on the padded sizes), the ring model of the calls
    made, MEASURED wire bytes, and wire / predicted; the amax all-reduces FP8 adds, counted apart."""
    rows = []
    world_size = int(df["rank"].max()) + 1
    for gather, part in df[df["rank"] == 0].groupby("gather", sort=False):
        ag = part[part.op == "all_gather"].iloc[0]
        pred = estimate.fsdp_allgather_bytes_sent(
            linear_params=int(ag.numel_linear),
            other_params=int(ag.numel_other),
            world_size=world_size,
            gather=gather,
        )
        ar = part[part.op == "all_reduce"]
        wire = ag.wire_sent
        rows.append(GatherSummaryRow(
            gather, int(ag.calls), pred, float(ag.model_sent), wire,
            None if wire is None else wire / pred, int(ar.calls.sum()) if len(ar) else 0,
            int(ar.wire_sent.sum()) if len(ar) else 0,
        ))  # fmt: skip
    return kit.frame(rows, GatherSummaryRow)


def memory_summary(df: pd.DataFrame) -> pd.DataFrame:
    """Rank 0's model-state bytes (fp32 shards + gradients + Adam moments, read from the tensors)
    and its largest gathered buffer, MEASURED, beside ``estimate.fsdp_fp8_memory_per_gpu``."""
    rows = []
    world_size = int(df["rank"].max()) + 1
    for gather, part in df[df["rank"] == 0].groupby("gather", sort=False):
        r = part.iloc[0]
        n_params = int(r.numel_linear + r.numel_other)
        pred = estimate.fsdp_fp8_memory_per_gpu(
            n_params, world_size, largest_layer_params=int(r.numel_largest), gather=gather
        )
        rows.append(MemorySummaryRow(
            gather, int(r.state_bytes), pred["sharded"], int(r.largest_gather_bytes), pred["gathered"]
        ))  # fmt: skip
    return kit.frame(rows, MemorySummaryRow)


def weight_cache_bytes(*, block: int = BLOCK) -> pd.DataFrame:
    """What an FP8 copy of the unit's GPT's linear weights (the output head excepted) adds beside
    the fp32 masters, per scaling: MEASURED from the casts' tensors (``Float8Data.nbytes``) and
    predicted by ``estimate.fp8_cast_bytes`` (weights get block x block blocks)."""
    from course_lib.techniques.fp8 import SCALINGS, to_float8

    model = model_fn(0)
    weights = [
        m.weight.detach()
        for n, m in model.named_modules()
        if isinstance(m, torch.nn.Linear) and n != "lm_head"
    ]
    master = sum(w.numel() * w.element_size() for w in weights)
    rows = []
    for scaling in SCALINGS:
        blk = (block, block) if scaling == "blockwise" else block
        measured = sum(to_float8(w, scaling=scaling, block=blk).nbytes() for w in weights)
        predicted = sum(
            estimate.fp8_cast_bytes(*w.shape, scaling=scaling, block=block, block_rows=block)
            for w in weights
        )
        rows.append(CacheRow(scaling, master, measured, predicted, measured / master))
    return kit.frame(rows, CacheRow)
