"""Attention over one block of keys, its backward, and the merge that makes blocks exact.

Softmax over all keys can be computed block by block if each block also returns the
log-sum-exp of its scores, ``lse = log sum_j exp(s_j)``: two partial results over disjoint key
sets combine exactly (FlashAttention's online softmax, Dao et al. 2022, arXiv:2205.14135;
Milakov and Gimelshein 2018, arXiv:1805.02867):

    lse = log(exp(lse_a) + exp(lse_b))
    out = out_a exp(lse_a - lse) + out_b exp(lse_b - lse)

Backward needs only the final ``lse`` and ``delta = rowsum(dout * out)``: the probabilities of
any block are ``exp(s - lse)`` again, so each block's gradients come from that block alone.
Grouped-query attention: k and v carry ``heads / g`` heads, repeated here for the scores and
summed back for their gradients. Introduced in notebooks/15_context_parallelism.ipynb.
"""

from __future__ import annotations

import math
from typing import Literal

import torch

__all__ = [
    "Visibility",
    "visibility",
    "block_mask",
    "attention_block",
    "merge_attention",
    "attention_block_backward",
]

#: how much of a (query chunk, key chunk) pair a causal mask lets through
Visibility = Literal["all", "none", "partial"]


def visibility(q_range: tuple[int, int], k_range: tuple[int, int], causal: bool) -> Visibility:
    """``"all"`` if every query of ``q_range`` may see every key of ``k_range`` (global token
    ranges, end exclusive), ``"none"`` if none may (a block causal attention skips), else
    ``"partial"``."""
    if not causal or k_range[1] - 1 <= q_range[0]:
        return "all"
    if k_range[0] > q_range[1] - 1:
        return "none"
    return "partial"


def block_mask(q_range: tuple[int, int], k_range: tuple[int, int]) -> torch.Tensor:
    """(n_q, n_k) bool, True where the key lies in the query's future (masked out)."""
    qpos = torch.arange(*q_range)
    kpos = torch.arange(*k_range)
    return kpos[None, :] > qpos[:, None]


def _repeat_kv(x: torch.Tensor, heads: int) -> torch.Tensor:
    """(B, kv_heads, n, D) -> (B, heads, n, D): each key/value head serves heads/kv_heads."""
    g = heads // x.shape[1]
    return x if g == 1 else x.repeat_interleave(g, dim=1)


def _sum_kv(x: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """(B, heads, n, D) -> (B, kv_heads, n, D): the adjoint of :func:`_repeat_kv`."""
    b, h, n, d = x.shape
    return x if h == kv_heads else x.view(b, kv_heads, h // kv_heads, n, d).sum(2)


def attention_block(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention of queries ``q`` (B, H, m, D) over ONE block of keys/values
    (B, H_kv, n, D), scale 1/sqrt(D): returns (out (B, H, m, D), lse (B, H, m)). ``mask``
    (m, n), True = hidden; every query must see at least one key of the block."""
    kk, vv = _repeat_kv(k, q.shape[1]), _repeat_kv(v, q.shape[1])
    s = (q @ kk.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))  # (B, H, m, n)
    if mask is not None:
        s = s.masked_fill(mask, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)  # (B, H, m)
    return torch.exp(s - lse.unsqueeze(-1)) @ vv, lse


def merge_attention(
    out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention over the union of two disjoint key sets from the attention over each
    (outputs (B, H, m, D), log-sum-exps (B, H, m)): the online-softmax merge."""
    lse = torch.logaddexp(lse_a, lse_b)  # (B, H, m)
    out = out_a * torch.exp(lse_a - lse).unsqueeze(-1) + out_b * torch.exp(lse_b - lse).unsqueeze(
        -1
    )
    return out, lse


def attention_block_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dout: torch.Tensor,
    lse: torch.Tensor,
    delta: torch.Tensor,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """This block's share of (dq, dk, dv), given the FINAL ``lse`` of the queries over all
    blocks and ``delta = (dout * out).sum(-1)`` (B, H, m). dk and dv have k's heads."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    kk, vv = _repeat_kv(k, q.shape[1]), _repeat_kv(v, q.shape[1])
    s = (q @ kk.transpose(-2, -1)) * scale  # (B, H, m, n)
    if mask is not None:
        s = s.masked_fill(mask, float("-inf"))
    p = torch.exp(s - lse.unsqueeze(-1))  # the block's probabilities under the full softmax
    dv = p.transpose(-2, -1) @ dout  # (B, H, n, D)
    dp = dout @ vv.transpose(-2, -1)  # (B, H, m, n)
    ds = p * (dp - delta.unsqueeze(-1)) * scale  # softmax's backward, scale folded in
    dq = ds @ kk  # (B, H, m, D)
    dk = ds.transpose(-2, -1) @ q  # (B, H, n, D)
    return dq, _sum_kv(dk, k.shape[1]), _sum_kv(dv, k.shape[1])
