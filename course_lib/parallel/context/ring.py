"""Ring attention (Liu, Zaharia, Abbeel 2023, arXiv:2310.01889) from scratch, forward and
backward.

Each rank keeps its queries; the keys and values travel around the ring. At step i rank r
holds the K/V block of rank r - i, computes attention of its queries over it (skipping the
chunks a causal mask hides entirely) and merges the partial result by log-sum-exp
(``blocks.merge_attention``), while the next block is already on its way: W - 1
sends of one K/V block per rank in forward.

Backward sends the K/V blocks around again and, with them, the gradients dK/dV accumulated so
far: each rank adds its queries' share to the dK/dV of the block it holds and passes the sum
on; after W steps every accumulator is back home (W sends of dK/dV, W - 1 of K/V). Nothing is
all-gathered. Introduced in notebooks/15_context_parallelism.ipynb.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist

from course_lib.parallel.context.blocks import (
    attention_block,
    attention_block_backward,
    block_mask,
    merge_attention,
    visibility,
)
from course_lib.parallel.context.layout import (
    check_qkv,
    check_same_shapes,
    cp_group,
    segments,
)
from course_lib.parallel.tensor.comms import apply
from course_lib.runtime.groups import Group, GroupInfo, global_rank

__all__ = ["ring_attention", "RingAttention"]

Ranges = list[tuple[int, int]]
Pending = tuple[torch.Tensor, list[Any]]


def _shift(t: torch.Tensor, info: GroupInfo, tag: int) -> Pending:
    """Post: send ``t`` to the next rank, receive the previous rank's into a new buffer. Both
    are posted before either is waited on (a blocking send around a ring deadlocks)."""
    r, w, group, _ = info
    buf = torch.empty_like(t)
    recv = dist.irecv(buf, global_rank(group, (r - 1) % w), group=group, tag=tag)
    send = dist.isend(t, global_rank(group, (r + 1) % w), group=group, tag=tag)
    return buf, [recv, send]


def _finish(pending: Pending) -> torch.Tensor:
    buf, reqs = pending
    for req in reqs:
        if req is not None:
            req.wait()
    return buf


@contextmanager
def _span(trace: list[dict[str, Any]] | None, **info: Any) -> Iterator[dict[str, Any]]:
    """Append {start, end (perf_counter seconds), **info} to ``trace`` around the block."""
    row = dict(info)
    start = time.perf_counter()
    yield row
    if trace is not None:
        trace.append({**row, "start": start, "end": time.perf_counter()})


def _pairs(mine: Ranges, theirs: Ranges, causal: bool) -> Iterator[tuple[int, int, Any]]:
    """(query chunk, key chunk, mask or None) for every pair the mask does not hide."""
    for i, qr in enumerate(mine):
        for j, kr in enumerate(theirs):
            vis = visibility(qr, kr, causal)
            if vis != "none":
                yield i, j, (block_mask(qr, kr) if vis == "partial" else None)


def _chunk(x: torch.Tensor, i: int, parts: int) -> torch.Tensor:
    c = x.shape[-2] // parts
    return x.narrow(-2, i * c, c)


class RingAttention(torch.autograd.Function):
    """Forward: W - 1 K/V sends around the ring. Backward: K/V around again, dK/dV with them."""

    @staticmethod
    def forward(
        ctx: Any,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        info: GroupInfo,
        causal: bool,
        layout: str,
        trace: list[dict[str, Any]] | None,
    ) -> torch.Tensor:
        r, w = info.rank, info.world_size
        seq = q.shape[2] * w
        mine = segments(seq, rank=r, world_size=w, layout=layout)
        parts = len(mine)
        kv = torch.stack([k, v]).contiguous()  # (2, B, H_kv, n, D): one message per step
        outs: list[Any] = [None] * parts
        lses: list[Any] = [None] * parts
        for step in range(w):
            theirs = segments(seq, rank=(r - step) % w, world_size=w, layout=layout)
            pending = _shift(kv, info, 0) if step < w - 1 else None
            with _span(trace, phase="forward", step=step, kind="compute") as row:
                row["blocks"] = 0
                for i, j, mask in _pairs(mine, theirs, causal):
                    o, lse = attention_block(
                        _chunk(q, i, parts), _chunk(kv[0], j, parts), _chunk(kv[1], j, parts), mask
                    )
                    if outs[i] is None:
                        outs[i], lses[i] = o, lse
                    else:
                        outs[i], lses[i] = merge_attention(outs[i], lses[i], o, lse)
                    row["blocks"] += 1
            if pending is not None:
                with _span(trace, phase="forward", step=step, kind="wait"):
                    kv = _finish(pending)
        out = torch.cat(outs, dim=2)  # (B, H, n, D)
        ctx.save_for_backward(q, k, v, out, torch.cat(lses, dim=2))
        ctx.info, ctx.causal, ctx.layout, ctx.trace = info, causal, layout, trace
        return out

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[Any, ...]:
        q, k, v, out, lse = ctx.saved_tensors
        info, trace = ctx.info, ctx.trace
        r, w = info.rank, info.world_size
        seq = q.shape[2] * w
        mine = segments(seq, rank=r, world_size=w, layout=ctx.layout)
        parts = len(mine)
        dout = dout.contiguous()
        delta = (dout * out).sum(-1)  # (B, H, n)
        dq = torch.zeros_like(q)
        kv = torch.stack([k, v]).contiguous()
        incoming: Pending | None = None  # the dK/dV accumulator on its way from rank r - 1
        for step in range(w):
            theirs = segments(seq, rank=(r - step) % w, world_size=w, layout=ctx.layout)
            pending = _shift(kv, info, 0) if step < w - 1 else None
            dkv = torch.zeros_like(kv)
            with _span(trace, phase="backward", step=step, kind="compute") as row:
                row["blocks"] = 0
                for i, j, mask in _pairs(mine, theirs, ctx.causal):
                    kj, vj = _chunk(kv[0], j, parts), _chunk(kv[1], j, parts)
                    g = attention_block_backward(
                        _chunk(q, i, parts),
                        kj,
                        vj,
                        _chunk(dout, i, parts),
                        _chunk(lse.unsqueeze(-1), i, parts).squeeze(-1),
                        _chunk(delta.unsqueeze(-1), i, parts).squeeze(-1),
                        mask,
                    )
                    _chunk(dq, i, parts).add_(g[0])
                    _chunk(dkv[0], j, parts).add_(g[1])
                    _chunk(dkv[1], j, parts).add_(g[2])
                    row["blocks"] += 1
            with _span(trace, phase="backward", step=step, kind="wait"):
                if incoming is not None:
                    dkv += _finish(incoming)
                if w > 1:  # pass the accumulator on; the last pass brings this rank's home
                    incoming = _shift(dkv, info, 1)
                if pending is not None:
                    kv = _finish(pending)
        dkv = _finish(incoming) if incoming is not None else dkv
        return dq, dkv[0], dkv[1], None, None, None, None


def ring_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    group: Group = None,
    causal: bool = True,
    layout: str = "zigzag",
    check_shapes: bool = True,
    trace: list[dict[str, Any]] | None = None,
) -> torch.Tensor:
    """Attention of this rank's queries over the whole sequence, K/V passed around the ring.

    q (B, H, n, D), k and v (B, H_kv, n, D): this rank's shards in ``layout`` (see
    ``layout``); returns this rank's output shard (B, H, n, D), equal to
    ``F.scaled_dot_product_attention`` on the full sequence, sharded. Differentiable.
    ``check_shapes`` all-gathers the shapes first (eight integers) so that mismatched ranks
    fail with one message; pass False where bytes are measured. ``trace``, if a list, receives
    one row per step and phase: compute (with the blocks computed) and wait, perf_counter
    seconds."""
    info = cp_group(group)
    check_qkv(q, k, v, world_size=info.world_size, layout=layout)
    if check_shapes:
        check_same_shapes(info, q, k)
    return apply(RingAttention, q, k, v, info, bool(causal), layout, trace)
