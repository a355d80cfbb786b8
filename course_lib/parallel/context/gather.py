"""All-gather K/V attention (Llama 3's context parallelism) and DeepSpeed-Ulysses, from
scratch, each a pair of autograd Functions around ordinary attention.

* **All-gather K/V** (Llama Team 2024, arXiv:2407.21783, Sec. 3.3.2): gather every rank's keys
  and values once (one all-gather of the stacked K/V), attend with the local queries under a
  mask built from global positions. Backward reduce-scatters dK/dV back to their owners,
  written as one all-to-all and a local sum (each rank sends only the chunks it does not keep:
  (W-1)/W of the full dK/dV, what a ring reduce-scatter sends).
* **Ulysses** (Jacobs et al. 2023, arXiv:2309.14509): an all-to-all turns the sequence split
  into a head split (every rank: all tokens, H/W heads), attention runs locally, and an
  all-to-all turns the output back. Backward is the same two moves, reversed. The heads (and
  the K/V heads) must divide by the ranks; the layout is contiguous.

Introduced in notebooks/15_context_parallelism.ipynb.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from course_lib.parallel.context.layout import (
    check_qkv,
    check_same_shapes,
    cp_group,
    positions,
)
from course_lib.parallel.tensor.comms import apply
from course_lib.runtime.compat import all_gather_single
from course_lib.runtime.groups import Group, GroupInfo

__all__ = [
    "allgather_kv_attention",
    "ulysses_attention",
    "AllGatherSequence",
    "SequenceToHeads",
    "HeadsToSequence",
]


# ---- all-gather K/V ------------------------------------------------------------------------
class AllGatherSequence(torch.autograd.Function):
    """Forward: all-gather every rank's shard, stacked (W, ...). Backward: reduce-scatter of
    the gradient (all-to-all of the chunks owned by others, then a local sum)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, info: GroupInfo) -> torch.Tensor:
        ctx.info = info
        x = x.contiguous()
        if info.world_size == 1:
            return x.unsqueeze(0)
        out = x.new_empty((info.world_size * x.shape[0], *x.shape[1:]))  # gloo: stacked on dim 0
        all_gather_single(out, x, group=info.group)
        return out.view(info.world_size, *x.shape)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        info = ctx.info
        grad = grad.contiguous()
        if info.world_size == 1:
            return grad[0], None
        got = torch.empty_like(grad)  # (W, ...): got[s] = rank s's gradient for my shard
        dist.all_to_all_single(got, grad, group=info.group)
        return got.sum(0), None


def allgather_kv_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    group: Group = None,
    causal: bool = True,
    layout: str = "zigzag",
    check_shapes: bool = True,
) -> torch.Tensor:
    """Attention of this rank's queries over the whole sequence after one all-gather of K/V.

    Same shards and result as ``ring_attention`` (q (B, H, n, D), k, v (B, H_kv, n, D) in
    ``layout``). The attention is PyTorch's ``scaled_dot_product_attention`` with a boolean
    mask from the tokens' global positions (so any mask, e.g. Llama 3's document mask, could be
    used instead); its backward is autograd's. ``check_shapes``: as in ``ring_attention``."""
    info = cp_group(group)
    check_qkv(q, k, v, world_size=info.world_size, layout=layout)
    if check_shapes:
        check_same_shapes(info, q, k)
    r, w = info.rank, info.world_size
    seq = q.shape[2] * w
    kv = apply(AllGatherSequence, torch.stack([k, v]), info)  # (W, 2, B, H_kv, n, D)
    b, hk, n, d = k.shape
    kv = kv.permute(1, 2, 3, 0, 4, 5).reshape(2, b, hk, seq, d)  # keys in rank-shard order
    kpos = torch.cat([positions(seq, rank=s, world_size=w, layout=layout) for s in range(w)])
    qpos = positions(seq, rank=r, world_size=w, layout=layout)
    mask = kpos[None, :] <= qpos[:, None] if causal else None  # (n, S): True = may attend
    return F.scaled_dot_product_attention(
        q, kv[0], kv[1], attn_mask=mask, enable_gqa=q.shape[1] != hk
    )


# ---- Ulysses -------------------------------------------------------------------------------
def _seq_to_heads(x: torch.Tensor, info: GroupInfo) -> torch.Tensor:
    """(B, H, n, D) sequence-sharded -> (B, H/W, W n, D) head-sharded (one all-to-all)."""
    w = info.world_size
    b, h, n, d = x.shape
    send = x.reshape(b, w, h // w, n, d).transpose(0, 1).contiguous()  # (W, B, H/W, n, D)
    got = torch.empty_like(send)  # got[s] = rank s's tokens of my heads
    dist.all_to_all_single(got, send, group=info.group)
    return got.permute(1, 2, 0, 3, 4).reshape(b, h // w, w * n, d)


def _heads_to_seq(x: torch.Tensor, info: GroupInfo) -> torch.Tensor:
    """(B, H/W, W n, D) head-sharded -> (B, H, n, D) sequence-sharded (one all-to-all)."""
    w = info.world_size
    b, hl, s, d = x.shape
    send = x.reshape(b, hl, w, s // w, d).permute(2, 0, 1, 3, 4).contiguous()  # (W, B, H/W, n, D)
    got = torch.empty_like(send)  # got[s] = my tokens of rank s's heads
    dist.all_to_all_single(got, send, group=info.group)
    return got.transpose(0, 1).reshape(b, w * hl, s // w, d)


class SequenceToHeads(torch.autograd.Function):
    """Forward: sequence split -> head split. Backward: head split -> sequence split."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, info: GroupInfo) -> torch.Tensor:
        ctx.info = info
        return x if info.world_size == 1 else _seq_to_heads(x, info)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return (grad if ctx.info.world_size == 1 else _heads_to_seq(grad, ctx.info)), None


class HeadsToSequence(torch.autograd.Function):
    """Forward: head split -> sequence split. Backward: sequence split -> head split."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, info: GroupInfo) -> torch.Tensor:
        ctx.info = info
        return x if info.world_size == 1 else _heads_to_seq(x, info)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return (grad if ctx.info.world_size == 1 else _seq_to_heads(grad, ctx.info)), None


def ulysses_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    group: Group = None,
    causal: bool = True,
    check_shapes: bool = True,
) -> torch.Tensor:
    """DeepSpeed-Ulysses: all-to-all q, k, v from a sequence split (contiguous layout) to a
    head split, ``scaled_dot_product_attention`` over the full sequence on H/W heads, and
    all-to-all the output back: this rank's output shard (B, H, n, D). Refuses heads (or K/V
    heads) not divisible by the ranks. Differentiable (backward: the reversed all-to-alls)."""
    info = cp_group(group)
    check_qkv(q, k, v, world_size=info.world_size, layout="contiguous", heads_split=True)
    if check_shapes:
        check_same_shapes(info, q, k)
    b, hk, n, d = k.shape
    qh = apply(SequenceToHeads, q, info)  # (B, H/W, S, D)
    # k and v of one head side by side, so that a rank's share of heads holds both
    kv = torch.stack([k, v], dim=2).reshape(b, 2 * hk, n, d)  # (B, [h0 k, h0 v, h1 k, ...], n, D)
    kvh = apply(SequenceToHeads, kv, info)  # (B, 2 H_kv/W, S, D)
    kvh = kvh.view(b, hk // info.world_size, 2, n * info.world_size, d)
    kh, vh = kvh[:, :, 0], kvh[:, :, 1]  # (B, H_kv/W, S, D) each
    out = F.scaled_dot_product_attention(
        qh, kh, vh, is_causal=bool(causal), enable_gqa=qh.shape[1] != kh.shape[1]
    )
    return apply(HeadsToSequence, out, info)
