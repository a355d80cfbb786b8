"""Unit 19, "FlashAttention from its parts": the online softmax step by step, parity of
``techniques.flash.flash_attention`` with ``F.scaled_dot_product_attention``, its memory against
the written-out attention (``MemoryMeter``), Dao et al.'s Theorem 2 at an H100's on-chip memory,
and a Llama 3 405B layer's attention memory. Re-exported by ``run.py``.

Sources: Dao et al. 2022 (arXiv:2205.14135), Theorem 2: standard attention makes
Theta(N d + N^2) accesses to HBM, FlashAttention Theta(N^2 d^2 / M) for an on-chip memory of M
values; NVIDIA H100 architecture whitepaper (2022): up to 228 KB of shared memory per SM;
Llama Team 2024 (arXiv:2407.21783), Table 3: 405B has width 16,384, 128 heads of 128, 8 K/V heads.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch
import torch.nn.functional as F

from course_lib import kit, validate
from course_lib.measure import estimate
from course_lib.techniques.flash import flash_attention, naive_attention

#: H100 shared memory per SM, bytes (NVIDIA H100 Tensor Core GPU Architecture whitepaper: up to
#: 228 KB of the 256 KB combined L1 / shared memory)
H100_SRAM_BYTES = 228 * 1024
#: Llama 3 405B (arXiv:2407.21783, Table 3)
LLAMA3_405B = {"hidden": 16384, "heads": 128, "kv_heads": 8, "ffn": 53248, "head_dim": 128}


@dataclass(frozen=True)
class SoftmaxStepRow:
    """:func:`online_softmax_steps`: one block of the row and the running statistics after it."""

    block: int
    block_max: float
    m: float
    rescale: float
    l: float  # noqa: E741 - the paper's name for the running sum


@dataclass(frozen=True)
class FlashParityRow:
    """:func:`parity_table`: flash_attention against the reference at one shape."""

    seq: int
    block_size: int
    key_blocks: int
    causal: bool
    out_err: float
    grad_err: float


@dataclass(frozen=True)
class AttentionMemoryRow:
    """:func:`attention_memory`: flash and written-out attention's bytes at one length."""

    seq: int
    block_size: int
    causal: bool
    flash_saved_bytes: int
    flash_peak_bytes: int
    naive_saved_bytes: int
    naive_peak_bytes: int
    flash_predicted_bytes: int
    naive_predicted_bytes: int


@dataclass(frozen=True)
class Theorem2Row:
    """:func:`theorem2`: HBM accesses of standard attention and of FlashAttention at one N."""

    N: int
    d: int
    M_values: int
    standard: float
    flash: float
    ratio: float


@dataclass(frozen=True)
class LlamaAttentionRow:
    """:func:`llama405b_attention`: one Llama 3 405B layer's attention memory at one length."""

    seq: int
    scores_GiB: float
    lse_GiB: float
    layer_naive_GiB: float
    layer_flash_GiB: float


def online_softmax_steps(x: Sequence[float], block_size: int) -> pd.DataFrame:
    """The online softmax of one row ``x``, a block at a time: per block its maximum, the
    running maximum m, the factor exp(m_old - m) the old sum is rescaled by, and the running
    sum l; the last row's m + log l is the row's log-sum-exp."""
    row = torch.as_tensor(list(x), dtype=torch.float64)
    b = validate.count("block_size", block_size, minimum=1)
    m, total, rows = float("-inf"), 0.0, []
    for i, start in enumerate(range(0, row.numel(), b)):
        block = row[start : start + b]
        m_new = max(m, float(block.max()))
        rescale = math.exp(m - m_new)  # exp(-inf) = 0 for the first block
        total = total * rescale + float(torch.exp(block - m_new).sum())
        rows.append(SoftmaxStepRow(i, float(block.max()), m_new, rescale, total))
        m = m_new
    return kit.frame(rows, SoftmaxStepRow)


def _inputs(
    n: int, *, heads: int = 2, head_dim: int = 16, seed: int = 0, dtype: torch.dtype = torch.float64
) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randn(1, heads, n, head_dim, generator=g, dtype=dtype).requires_grad_()
        for _ in range(3)
    ]


def parity_table(
    seqs: Sequence[int] = (1, 37, 64, 130), block_sizes: Sequence[int] = (16, 64)
) -> pd.DataFrame:
    """flash_attention against F.scaled_dot_product_attention in float64, causal and not: the
    largest absolute difference of the output and of dq, dk, dv (one random upstream
    gradient). One row per (seq, block_size, causal) with the number of key blocks."""
    rows = []
    for n in validate.counts("seqs", seqs):
        for bs in validate.counts("block_sizes", block_sizes):
            for causal in (False, True):
                q, k, v = _inputs(n)
                out = flash_attention(q, k, v, causal=causal, block_size=bs)
                ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                dout = torch.randn_like(out)
                got = torch.autograd.grad(out, (q, k, v), dout)
                want = torch.autograd.grad(ref, (q, k, v), dout)
                out_err = float((out - ref).detach().abs().max())
                grad_err = max(float((a - b).abs().max()) for a, b in zip(got, want))
                rows.append(FlashParityRow(n, bs, -(-n // bs), causal, out_err, grad_err))
    return kit.frame(rows, FlashParityRow)


def attention_memory(
    seq: int, *, block_size: int = 64, causal: bool = True, heads: int = 2, head_dim: int = 32
) -> AttentionMemoryRow:
    """Measured with MemoryMeter, float32, batch 1, for "flash" and "naive": the bytes alive
    after a forward that it created (what is saved for backward, with the output) and, in a
    second run, the peak over forward + backward (q, k, v and the upstream gradient counted); with flash's prediction 4 B x heads x seq x (head_dim + 1)
    (the output and one log-sum-exp per row) and naive's largest term, one (seq, seq) matrix
    per head (4 B x heads x seq^2)."""
    from course_lib.measure.memory import MemoryMeter

    n = validate.count("seq", seq, minimum=1)
    flash = functools.partial(flash_attention, block_size=block_size)
    measured = []  # flash saved, flash peak, naive saved, naive peak
    for attention in (flash, naive_attention):
        for backward in (False, True):
            q, k, v = _inputs(n, heads=heads, head_dim=head_dim, dtype=torch.float32)
            dout = torch.randn(1, heads, n, head_dim)
            with MemoryMeter(track=(q, k, v, dout)) as mem:
                out = attention(q, k, v, causal=causal)
                if backward:
                    out.backward(dout)
            # forward alone: what it leaves alive (the output and what autograd saved)
            measured.append(mem.peak_bytes if backward else mem.end_breakdown["activations"])
            del out
    flash_saved, flash_peak, naive_saved, naive_peak = measured
    return AttentionMemoryRow(
        n, block_size, causal, flash_saved, flash_peak, naive_saved, naive_peak,
        4 * heads * n * (head_dim + 1), 4 * heads * n * n,
    )  # fmt: skip


def memory_sweep(seqs: Sequence[int] = (128, 256, 512), *, block_size: int = 64) -> pd.DataFrame:
    """:func:`attention_memory` at each sequence length, one row each."""
    rows = [attention_memory(n, block_size=block_size) for n in validate.counts("seqs", seqs)]
    return kit.frame(rows, AttentionMemoryRow)


def theorem2(
    seqs: Sequence[int] = (1024, 8192, 131072),
    *,
    head_dim: int = 128,
    sram_bytes: int = H100_SRAM_BYTES,
    bytes_per_value: int = 2,
) -> pd.DataFrame:
    """Dao et al.'s Theorem 2 with its constants set to 1: HBM accesses (values) of standard
    attention N d + N^2 and of FlashAttention N^2 d^2 / M, M = on-chip values
    (``sram_bytes / bytes_per_value``); one row per N with their ratio."""
    d = validate.count("head_dim", head_dim, minimum=1)
    m = validate.count("sram_bytes", sram_bytes, minimum=1) // validate.count(
        "bytes_per_value", bytes_per_value, minimum=1
    )
    rows = []
    for n in validate.counts("seqs", seqs):
        standard, flash = n * d + n * n, n * n * d * d / m
        rows.append(Theorem2Row(n, d, m, standard, flash, standard / flash))
    return kit.frame(rows, Theorem2Row)


def llama405b_attention(seqs: Sequence[int] = (8192, 131072), *, batch: int = 1) -> pd.DataFrame:
    """One Llama 3 405B layer on one GPU (no tensor or context parallelism), bf16: the
    attention core Korthikanti et al. keep for backward (softmax output, dropout mask and
    output: 5 a s^2 b bytes, from ``estimate``), FlashAttention's log-sum-exps (fp32, a s b
    values), and the whole layer's activations with each, GiB."""
    m = LLAMA3_405B
    b = validate.count("batch", batch, minimum=1)
    rows = []
    for s in validate.counts("seqs", seqs):
        kw: dict[str, Any] = dict(kv_heads=m["kv_heads"], ffn=m["ffn"], gated_mlp=True)
        full = estimate.activation_bytes_transformer_layer(s, b, m["hidden"], m["heads"], **kw)
        flash = estimate.activation_bytes_transformer_layer(
            s, b, m["hidden"], m["heads"], recompute="selective", **kw
        )
        lse, scores = 4 * m["heads"] * s * b, 5 * m["heads"] * s * s * b
        gib = (x / 2**30 for x in (scores, lse, full, flash + lse))
        rows.append(LlamaAttentionRow(s, *gib))
    return kit.frame(rows, LlamaAttentionRow)
