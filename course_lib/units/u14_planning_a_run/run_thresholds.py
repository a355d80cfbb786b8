"""Unit 14, "When communication hides": every overlap threshold of ``estimate.overlap`` at real
sizes, on an H100 (989 TFLOP/s dense bf16) over NVLink (450 GB/s per direction) or one
InfiniBand NDR port (50 GB/s per direction), beside what a published run has.

Each row is measured in its own unit on two real ranks (09 DP, 10 FSDP, 11 TP, 12 PP, 15 CP,
16 EP) with compute slowed by a known factor; here only the formula, evaluated where it matters.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from course_lib.measure import estimate

__all__ = ["threshold_table"]

_H100 = estimate.gpu_spec("H100").peak_flops
_NVLINK = estimate.link_speed("NVLink H100")
_IB = estimate.link_speed("InfiniBand NDR")


def _links(kw: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``kw`` with NVLink's and with one InfiniBand port's GB/s per direction."""
    return (
        dict(kw, link_GBps=_NVLINK.per_direction_GBps),
        dict(kw, link_GBps=_IB.per_direction_GBps),
    )


def _dp_tp_rows(kw: dict[str, Any]) -> list[tuple[Any, ...]]:
    nv, ib = _links(kw)
    dp_ib = estimate.dp_overlap_min_tokens(world_size=128, **ib)
    return [
        ("DP / FSDP", "tokens per GPU", "Llama-2-7B, dp 8 in a node, 4,096 a GPU", _NVLINK,
         estimate.dp_overlap_min_tokens(world_size=8, **nv), 4096),
        ("DP", "tokens per GPU", "Llama 3 405B, 16K GPUs: dp 128 over nodes, 8,192 a GPU", _IB,
         dp_ib, 8192),
        ("FSDP (FP8 gather)", "tokens per GPU", "the same, weights gathered in FP8", _IB,
         estimate.fsdp_overlap_min_tokens(world_size=128, param_bytes=1, **ib), 8192),
        ("TP", "hidden size", "Llama 3 405B, tp 8 in a node, h 16,384", _NVLINK,
         estimate.tp_overlap_min_hidden(tp=8, **nv), 16384),
        ("TP", "hidden size", "MT-NLG, tp 16 over two nodes, h 20,480", _IB,
         estimate.tp_overlap_min_hidden(tp=16, **ib), 20480),
    ]  # fmt: skip


def _pp_cp_rows(kw: dict[str, Any]) -> list[tuple[Any, ...]]:
    _, ib = _links(kw)
    gqa = estimate.cp_ring_overlap_min_tokens(heads=128, kv_heads=8, tp=8, **ib)
    return [
        ("PP", "micro-batches (bubble < 5 %)", "Llama 3 405B: pp 16, v 4, 16 micro-batches", None,
         estimate.pp_bubble_micro_batches(16, 0.05, virtual_stages=4), 16),
        ("PP", "transfer / compute (at most)", "Llama 3 405B: 8 layers a stage", _IB, 1.0,
         estimate.pp_transfer_to_compute(hidden=16384, layers=8, **ib)),
        ("CP (ring)", "tokens per rank", "full multi-head attention, 128K over cp 16", _IB,
         estimate.cp_ring_overlap_min_tokens(heads=128, **ib), 8192),
        ("CP (ring)", "tokens per rank", "Llama 3 405B, tp 8: 128K over cp 16", _IB, gqa, 8192),
        ("CP (ring)", "tokens per rank", "Llama 3 405B, tp 8: 8K over cp 16", _IB, gqa, 512),
    ]  # fmt: skip


def _ep_rows(kw: dict[str, Any]) -> list[tuple[Any, ...]]:
    """DeepSeek-V3's experts; 4,096 tokens a rank, 8 of 256 experts each: ep x 4,096 x 8 / 256
    tokens an expert."""
    nv, ib = _links(kw)
    ds: dict[str, Any] = dict(hidden=7168, ffn=2048, experts=256, gated_mlp=True)
    ep8 = estimate.ep_overlap_min_tokens_per_expert(
        ep=8, alpha_s=_NVLINK.alpha_us * 1e-6, **ds, **nv
    )
    ep64 = estimate.ep_overlap_min_tokens_per_expert(ep=64, alpha_s=_IB.alpha_us * 1e-6, **ds, **ib)
    return [
        ("EP", "tokens per expert", "DeepSeek-V3 experts, ep 8 in a node", _NVLINK, ep8,
         8 * 4096 * 8 / 256),
        ("EP", "tokens per expert", "DeepSeek-V3 experts, ep 64 across nodes", _IB, ep64,
         64 * 4096 * 8 / 256),
    ]  # fmt: skip


def threshold_table(mfu: float = 1.0) -> pd.DataFrame:
    """One row per threshold (``estimate.overlap``) at real sizes: ``parallelism``,
    ``quantity`` compared, the ``case`` (a published shape), its ``link``, ``needs`` (the
    threshold at ``mfu`` of the H100's bf16 peak: at least this, or at most for the transfer
    ratio; ``inf``: no size hides it), ``has`` (the case's value) and ``hides``. Ring attention
    rows count full (non-causal) blocks, Liu et al.'s form; a causal zig-zag doubles them."""
    kw: dict[str, Any] = dict(peak_flops=_H100, mfu=mfu)
    rows = _dp_tp_rows(kw) + _pp_cp_rows(kw) + _ep_rows(kw)
    df = pd.DataFrame(rows, columns=["parallelism", "quantity", "case", "link", "needs", "has"])
    df["link"] = ["-" if link is None else link.name for link in df.link]
    at_most = df.quantity.str.startswith("transfer")
    df["hides"] = (df.has <= df.needs).where(at_most, df.has >= df.needs)
    return df
