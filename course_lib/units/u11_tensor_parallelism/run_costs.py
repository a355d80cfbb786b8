"""Unit 11, what tensor parallelism costs: collectives and bytes per step, memory per rank.

Used by notebooks/11_tensor_parallelism.ipynb through :mod:`run` (which re-exports these names).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import pandas as pd
import torch
import torch.distributed as dist

from course_lib import kit, validate
from course_lib.measure import estimate
from course_lib.models import GPTConfig
from course_lib.parallel import harness as H
from course_lib.runtime.launch import launch
from course_lib.units.u11_tensor_parallelism._setup import (
    BATCH,
    CONFIG,
    _check,
    batch_fn,
    model_fn,
)


# --------------------------------------------------------------------------------------------
# collectives and bytes per step
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CollectiveRow:
    """One rank, mode, phase and op of :func:`collective_counts` (bytes of one step)."""

    rank: int
    tp: int
    sequence_parallel: bool
    phase: str
    op: str
    calls: int
    payload_bytes: int
    model_sent: float
    wire_sent: int | None


def _comm_worker(
    rank: int, world_size: int, config: GPTConfig, batch: int, sp: bool
) -> list[CollectiveRow]:
    from course_lib.measure.comm import CommMeter, collective_family
    from course_lib.parallel.tensor import parallelize_gpt, sync_sequence_parallel_grads

    model = parallelize_gpt(model_fn(config=config), sequence_parallel=sp)
    x, y = batch_fn(0, config=config, batch=batch)
    H.cross_entropy_loss(model, (x, y)).backward()  # warm-up: first calls set up gloo buffers
    model.zero_grad(set_to_none=True)
    rows = []
    dist.barrier()
    with CommMeter(dispatch=False) as fwd:
        loss = H.cross_entropy_loss(model, (x, y))
    with CommMeter(dispatch=False) as bwd:
        loss.backward()
    with CommMeter(dispatch=False) as sync:
        sync_sequence_parallel_grads(model)
    for phase, meter in (("forward", fwd), ("backward", bwd), ("grad sync", sync)):
        for op, n in meter.calls.items():
            recs = [r for r in meter.records if r["op"] == op]
            wire = [r["wire_sent"] for r in recs]
            rows.append(
                CollectiveRow(
                    rank=rank,
                    tp=world_size,
                    sequence_parallel=sp,
                    phase=phase,
                    op=collective_family(op),
                    calls=n,
                    payload_bytes=sum(r["bytes"] for r in recs),
                    model_sent=float(sum(r["model_sent"] for r in recs)),
                    wire_sent=None if None in wire else int(sum(wire)),
                )
            )
    return rows


def collective_counts(
    tp: int = 2,
    *,
    config: GPTConfig = CONFIG,
    batch: int = BATCH,
    sequence_parallel: Sequence[bool] = (False, True),
) -> pd.DataFrame:
    """One training step of the split tiny GPT; CommMeter in every rank counts each
    collective in forward, in backward, and in the gradient sync of sequence parallelism. One
    row per rank, mode, phase and op: calls, payload_bytes (the tensors handed to the calls),
    model_sent (the ring model's bytes, ``estimate.collective_bytes_sent``), wire_sent (MEASURED:
    bytes the rank wrote to its sockets during the calls, /proc/self/io)."""
    tp = _check(tp, config, sequence_parallel=any(sequence_parallel))
    b = validate.count("batch", batch, minimum=1)
    runs = [launch(_comm_worker, tp, config, b, bool(sp)) for sp in sequence_parallel]
    return kit.frame(kit.rows_of(runs, CollectiveRow), CollectiveRow)


@dataclass(frozen=True)
class WireSummaryRow:
    """One tp and mode of :func:`wire_summary` (bytes one rank sends per step)."""

    tp: int
    sequence_parallel: bool
    calls: int
    predicted: int
    model_of_calls: float
    wire: int | None  # None: the OS cannot see the sockets
    ratio: float | None = field(metadata=kit.column("wire/predicted"))


def wire_summary(
    counts: pd.DataFrame, *, config: GPTConfig = CONFIG, batch: int = BATCH
) -> pd.DataFrame:
    """Bytes one rank sends per training step (forward + backward of every layer; rank 0, the
    ranks of a ring send alike) from :func:`collective_counts` frames: calls, predicted
    (``estimate.tp_comm_bytes_per_layer`` x n_layer: the ring algorithms), model_of_calls (the
    ring model applied to the calls actually made, the sequence-parallel boundary gathers
    included), wire (MEASURED by the OS), wire/predicted. One row per tp and mode."""
    rows = []
    df = counts[(counts["rank"] == 0) & (counts.phase != "grad sync")]
    for (t, sp), part in df.groupby(["tp", "sequence_parallel"]):
        pred = estimate.tp_comm_bytes_per_layer(
            config.block_size, batch, config.n_embd, t, dtype_bytes=4, sequence_parallel=sp
        )
        wire = None if part.wire_sent.isna().any() else int(part.wire_sent.sum())
        predicted = pred["sent"] * config.n_layer
        ratio = None if wire is None else wire / predicted
        calls, model = int(part.calls.sum()), part.model_sent.sum()
        rows.append(WireSummaryRow(t, bool(sp), calls, predicted, model, wire, ratio))
    return kit.frame(rows, WireSummaryRow)


def wire_bytes(
    tps: Sequence[int] = (2, 4),
    *,
    config: GPTConfig = CONFIG,
    batch: int = BATCH,
    sequence_parallel: Sequence[bool] = (False, True),
) -> pd.DataFrame:
    """:func:`collective_counts` for each tp, summarised by :func:`wire_summary`."""
    sizes = validate.counts("tps", tps, minimum=2)
    frames = [
        collective_counts(t, config=config, batch=batch, sequence_parallel=sequence_parallel)
        for t in sizes
    ]
    return wire_summary(pd.concat(frames, ignore_index=True), config=config, batch=batch)


# --------------------------------------------------------------------------------------------
# memory per rank
# --------------------------------------------------------------------------------------------
def _memory_worker(
    rank: int, world_size: int, config: GPTConfig, batch: int, sp: bool
) -> dict[str, int]:
    from course_lib.measure.memory import MemoryMeter
    from course_lib.parallel.tensor import parallelize_gpt, sync_sequence_parallel_grads

    model = parallelize_gpt(model_fn(config=config), sequence_parallel=sp)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = batch_fn(0, config=config, batch=batch)
    with MemoryMeter(model, opt) as mem:
        logits = model(x)  # (B, T, V): held, as estimate.activation_bytes_gpt counts it
        # gloo's worker thread lets go of the last all-reduce's buffer a moment after the call
        # returns (measured: one BTC tensor too many, now and then, on one rank); wait for every
        # rank's calls to finish and give the thread a moment, then take the snapshot (the
        # meter records a row at every module call)
        if dist.is_initialized():
            dist.barrier()
            time.sleep(0.02)
        _SNAPSHOT(logits)
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten()).backward()
        del logits
        sync_sequence_parallel_grads(model)
        opt.step()
    tl = mem.timeline
    fw = tl[tl.event == "post_forward"]
    end_fw = fw[fw.phase == "forward"].iloc[-1]  # the snapshot's row
    out = {c: int(tl[c].max()) for c in ("params", "grads", "optimizer")}
    out["activations"] = int(end_fw["activations"])
    out["buffers"] = sum(b.numel() * b.element_size() for b in model.buffers())
    out["param_tensors"] = len(list(model.parameters()))
    return out


_SNAPSHOT = torch.nn.Identity()


@dataclass(frozen=True)
class MemoryRow:
    """One tp, mode, rank and category of :func:`memory_per_rank` (bytes)."""

    tp: int
    sequence_parallel: bool
    rank: int
    category: str
    measured: int
    predicted: int
    residual: int


def memory_per_rank(
    tps: Sequence[int] = (1, 2, 4),
    *,
    config: GPTConfig = CONFIG,
    batch: int = BATCH,
    sequence_parallel: Sequence[bool] = (False, True),
) -> pd.DataFrame:
    """One Adam step of the split tiny GPT (float32) under MemoryMeter in every rank. One row
    per tp, mode, rank and category (params, grads, optimizer, activations): measured (params,
    grads, optimizer: the largest value over the step; activations: alive at the end of the
    forward, logits held), predicted (``estimate.tp_params_per_rank`` x 4 B, plus the buffers
    for params; Adam's two moments x 4 B plus a 4-byte step counter per tensor;
    ``estimate.activation_bytes_gpt``), residual (measured - predicted). Bytes."""
    sizes = validate.counts("tps", tps, minimum=1)
    b = validate.count("batch", batch, minimum=1)
    rows: list[MemoryRow] = []
    for t in sizes:
        for sp in sequence_parallel:
            sp = bool(sp) and t > 1
            if any(r.tp == t and r.sequence_parallel == sp for r in rows):
                continue  # tp = 1 has nothing to split along the sequence
            _check(t, config, sequence_parallel=sp)
            n = estimate.tp_params_per_rank(config, t)["per_rank"]
            for rank, m in enumerate(launch(_memory_worker, t, config, b, sp)):
                pred = {
                    "params": 4 * n + m["buffers"],
                    "grads": 4 * n,
                    "optimizer": 8 * n + 4 * m["param_tensors"],
                    "activations": estimate.activation_bytes_gpt(
                        config, b, tp=t, sequence_parallel=sp
                    ),
                }
                rows += [MemoryRow(t, sp, rank, c, m[c], p, m[c] - p) for c, p in pred.items()]
    return kit.frame(rows, MemoryRow)
