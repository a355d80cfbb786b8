"""FlashAttention from its parts: the online softmax and a tiled attention with its own backward.

The online softmax (Milakov and Gimelshein 2018, arXiv:1805.02867) reads a row once, block by
block, and keeps two numbers per row: the running maximum ``m`` and the running sum
``l = sum_j exp(x_j - m)``. When a block raises the maximum to ``m'``, the old sum is rescaled by
``exp(m - m')`` before the block's terms are added; at the end ``log-sum-exp = m + log l``.

FlashAttention (Dao et al. 2022, arXiv:2205.14135; the loop order of FlashAttention-2, Dao 2023,
arXiv:2307.08691) applies the same rescaling to the running *output*: for each block of queries
it walks the blocks of keys, keeping ``m``, ``l`` and an unnormalised accumulator ``acc``:

    m' = max(m, rowmax(S_j))          S_j = Q_i K_j^T / sqrt(d)   (block x block)
    P  = exp(S_j - m')
    l  = l exp(m - m') + rowsum(P)
    acc = acc exp(m - m') + P V_j     <- forget this rescale and the output is wrong
    out_i = acc / l,  lse_i = m + log l

Only one (block x block) score tile exists at a time. Backward saves q, k, v, the output and the
log-sum-exps (O(seq) per head, never the (seq, seq) probabilities) and recomputes each tile's
probabilities as ``exp(S - lse)``, with ``delta = rowsum(dO * O)``: ``dS = P (dO V^T - delta)``.
Unit 15 uses the same algebra across ranks (``course_lib.parallel.context.blocks``:
``merge_attention`` on normalised outputs, ``attention_block_backward`` per block); that layer
sits above this one, so the tile step is written here for one process.

On a CPU this is slower than ``F.scaled_dot_product_attention``: what it shows here is the memory
(linear in the sequence) and the algebra; the speed of the real kernel comes from keeping the tile
in a GPU's on-chip SRAM. Introduced in notebooks/19_inside_the_step.ipynb.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from course_lib import validate

__all__ = [
    "online_logsumexp",
    "online_softmax",
    "flash_attention",
    "FlashAttention",
    "naive_attention",
    "FLOAT_DTYPES",
]

#: dtypes flash_attention accepts (bf16 / fp16 inputs are accumulated in float32)
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _causal_mask(q_range: tuple[int, int], k_range: tuple[int, int]) -> torch.Tensor:
    """(n_q, n_k) bool for global token ranges (end exclusive): True where the key lies in the
    query's future."""
    return torch.arange(*k_range)[None, :] > torch.arange(*q_range)[:, None]


def _seen(q_range: tuple[int, int], k_range: tuple[int, int], causal: bool) -> str:
    """ "all" if every query of the tile may see every key, "none" if none may, else "partial"."""
    if not causal or k_range[1] - 1 <= q_range[0]:
        return "all"
    return "none" if k_range[0] > q_range[1] - 1 else "partial"


def _check_block_size(block_size: Any) -> int:
    return validate.count("block_size", block_size, minimum=1)


def online_logsumexp(x: torch.Tensor, *, block_size: int = 64) -> torch.Tensor:
    """``log sum_j exp(x[..., j])`` over the last dimension, reading it ``block_size`` columns
    at a time with a running maximum and a rescaled running sum (one pass, no second read)."""
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise TypeError(f"x = {validate.describe(x)}: expected a floating-point tensor")
    if x.dim() == 0 or x.shape[-1] == 0:
        raise ValueError(f"x.shape = {tuple(x.shape)}: expected a non-empty last dimension")
    block_size = _check_block_size(block_size)
    m = torch.full(x.shape[:-1], float("-inf"), dtype=x.dtype, device=x.device)  # (...,)
    s = torch.zeros_like(m)  # (...,) sum of exp(x - m) so far
    for start in range(0, x.shape[-1], block_size):
        block = x[..., start : start + block_size]  # (..., b)
        m_new = torch.maximum(m, block.amax(-1))
        s = s * torch.exp(m - m_new) + torch.exp(block - m_new.unsqueeze(-1)).sum(-1)
        m = m_new
    return m + torch.log(s)


def online_softmax(x: torch.Tensor, *, block_size: int = 64) -> torch.Tensor:
    """Softmax over the last dimension from :func:`online_logsumexp`: ``exp(x - lse)``."""
    return torch.exp(x - online_logsumexp(x, block_size=block_size).unsqueeze(-1))


def naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False):
    """softmax(Q K^T / sqrt(d)) V written out: autograd keeps the (seq, seq) probabilities for
    backward. The O(seq^2) comparator (``F.scaled_dot_product_attention`` on CPU already runs a
    flash-style kernel and keeps none)."""
    s = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])  # (B, H, n, n)
    if causal:
        s = s.masked_fill(_causal_mask((0, q.shape[-2]), (0, k.shape[-2])).to(s.device), -math.inf)
    return torch.softmax(s, dim=-1) @ v  # (B, H, n, D)


def _check_inputs(q: Any, k: Any, v: Any, causal: Any, block_size: Any) -> int:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} = {validate.describe(t)}: expected a torch.Tensor")
        if t.dtype not in FLOAT_DTYPES:
            raise TypeError(
                f"{name}.dtype = {t.dtype}: expected one of "
                + ", ".join(str(d) for d in FLOAT_DTYPES)
            )
        if t.dim() != 4 or 0 in t.shape:
            raise ValueError(
                f"{name}.shape = {tuple(t.shape)}: expected 4 non-zero sizes "
                "(batch, heads, seq, head_dim)"
            )
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(
            f"k.dtype, v.dtype = {k.dtype}, {v.dtype}: expected q's dtype {q.dtype} for both"
        )
    if not (q.device == k.device == v.device):
        raise ValueError(f"k.device, v.device = {k.device}, {v.device}: expected q's {q.device}")
    if k.shape != v.shape or k.shape[:2] != q.shape[:2] or k.shape[3] != q.shape[3]:
        raise ValueError(
            f"k.shape, v.shape = {tuple(k.shape)}, {tuple(v.shape)}: expected both "
            f"(batch, heads, any seq, head_dim) = ({q.shape[0]}, {q.shape[1]}, n, {q.shape[3]})"
        )
    if not isinstance(causal, bool):
        raise TypeError(f"causal = {validate.describe(causal)}: expected True or False")
    if causal and k.shape[2] != q.shape[2]:
        raise ValueError(
            f"k.shape[2] = {k.shape[2]}: expected q's sequence length {q.shape[2]} with causal=True"
        )
    return _check_block_size(block_size)


def _blocks(n: int, size: int) -> list[tuple[int, int]]:
    return [(start, min(start + size, n)) for start in range(0, n, size)]


def _forward(q, k, v, causal: bool, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Tiled forward in float32 or float64: (out (B, H, n, D), lse (B, H, n))."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[:-1], dtype=q.dtype, device=q.device)
    for qr in _blocks(q.shape[2], block_size):
        qi = q[:, :, qr[0] : qr[1]]  # (B, H, br, D)
        m = torch.full(qi.shape[:-1], -math.inf, dtype=q.dtype, device=q.device)  # (B, H, br)
        row_sum = torch.zeros_like(m)  # (B, H, br), the l of the papers
        acc = torch.zeros_like(qi)  # (B, H, br, D), unnormalised
        for kr in _blocks(k.shape[2], block_size):
            seen = _seen(qr, kr, causal)
            if seen == "none":
                continue
            s = (qi @ k[:, :, kr[0] : kr[1]].transpose(-2, -1)) * scale  # (B, H, br, bc)
            if seen == "partial":
                s = s.masked_fill(_causal_mask(qr, kr).to(s.device), -math.inf)
            m_new = torch.maximum(m, s.amax(-1))
            p = torch.exp(s - m_new.unsqueeze(-1))  # (B, H, br, bc)
            alpha = torch.exp(m - m_new)  # (B, H, br): how much the old maximum overstated
            row_sum = row_sum * alpha + p.sum(-1)
            acc = acc * alpha.unsqueeze(-1) + p @ v[:, :, kr[0] : kr[1]]
            m = m_new
        out[:, :, qr[0] : qr[1]] = acc / row_sum.unsqueeze(-1)
        lse[:, :, qr[0] : qr[1]] = m + torch.log(row_sum)
    return out, lse


def _backward(q, k, v, out, lse, dout, causal: bool, block_size: int):
    """Tile by tile, probabilities recomputed from the saved lse: (dq, dk, dv)."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    delta = (dout * out).sum(-1, keepdim=True)  # (B, H, n, 1): rowsum(dO * O)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for qr in _blocks(q.shape[2], block_size):
        rows = slice(qr[0], qr[1])
        qi, do_i = q[:, :, rows], dout[:, :, rows]  # (B, H, br, D)
        for kr in _blocks(k.shape[2], block_size):
            seen = _seen(qr, kr, causal)
            if seen == "none":
                continue
            cols = slice(kr[0], kr[1])
            kj, vj = k[:, :, cols], v[:, :, cols]  # (B, H, bc, D)
            s = (qi @ kj.transpose(-2, -1)) * scale  # (B, H, br, bc), recomputed
            if seen == "partial":
                s = s.masked_fill(_causal_mask(qr, kr).to(s.device), -math.inf)
            p = torch.exp(s - lse[:, :, rows].unsqueeze(-1))  # the tile under the full softmax
            dv[:, :, cols] += p.transpose(-2, -1) @ do_i
            ds = p * (do_i @ vj.transpose(-2, -1) - delta[:, :, rows]) * scale  # softmax's backward
            dq[:, :, rows] += ds @ kj
            dk[:, :, cols] += ds.transpose(-2, -1) @ qi
    return dq, dk, dv


class FlashAttention(torch.autograd.Function):
    """Tiled exact attention; saves q, k, v, out and lse (B, H, n) for backward."""

    @staticmethod
    def forward(ctx, q, k, v, causal: bool, block_size: int):
        work = torch.promote_types(q.dtype, torch.float32)
        qf, kf, vf = (t.detach().to(work) for t in (q, k, v))
        out, lse = _forward(qf, kf, vf, causal, block_size)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal, ctx.block_size = causal, block_size
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        work = out.dtype
        grads = _backward(
            q.to(work), k.to(work), v.to(work), out, lse, dout.to(work), ctx.causal,
            ctx.block_size,
        )  # fmt: skip
        dq, dk, dv = (g.to(q.dtype) for g in grads)
        return dq, dk, dv, None, None


def flash_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    block_size: int = 64,
) -> torch.Tensor:
    """Exact softmax attention, scale 1/sqrt(head_dim), computed in (block_size x block_size)
    tiles with the online softmax; equal to ``F.scaled_dot_product_attention(q, k, v,
    is_causal=causal)`` in value and gradients.

    Args:
        q: (batch, heads, seq, head_dim); k, v: (batch, heads, seq_k, head_dim), same dtype
            (float16, bfloat16, float32 or float64; halves are accumulated in float32) and device.
        causal: hide every key after the query's position (needs seq_k == seq).
        block_size: rows and columns of a tile, a positive int (a tail block may be shorter).

    For backward it keeps q, k, v, the output and one log-sum-exp per query row, O(seq) per head.
    """
    block_size = _check_inputs(q, k, v, causal, block_size)
    result = FlashAttention.apply(q, k, v, causal, block_size)
    assert isinstance(result, torch.Tensor)
    return result
