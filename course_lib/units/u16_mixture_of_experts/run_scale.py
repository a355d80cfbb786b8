"""Unit 16, nothing runs: Mixtral 8x7B and DeepSeek-V3 sized from their published
architectures with ``estimate.moe_*`` (``unit.run.scale``, ``unit.run.MODELS``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

from course_lib import kit
from course_lib.measure import estimate

__all__ = ["MODELS", "architecture_params", "scale"]

#: published architectures. Mixtral 8x7B: Jiang et al. 2024 (arXiv:2401.04088), Table 1; its
#: 46.7B total / 12.9B active are Mistral AI's announcement's (the paper rounds to 47B / 13B).
#: DeepSeek-V3: DeepSeek-AI 2024 (arXiv:2412.19437), Sec. 4.2 (61 layers, width 7168, MLA
#: with 128 heads of 128, KV compression 512, query compression 1536, decoupled RoPE 64; the
#: first 3 layers dense; then 1 shared + 256 routed experts of width 2048, 8 active, each
#: token sent to at most 4 nodes). The dense layers' FFN width 18,432 and the vocabulary
#: 129,280 are from the released model's config, not the paper.
MODELS: dict[str, dict[str, Any]] = {
    "Mixtral 8x7B": dict(layers=32, moe_layers=32, hidden=4096, ffn=14336, experts=8, top_k=2,
                         shared=0, dense_ffn=0, vocab=32000, heads=32, kv_heads=8, mla=None,
                         published_total=46.7e9, published_active=12.9e9),
    "DeepSeek-V3": dict(layers=61, moe_layers=58, hidden=7168, ffn=2048, experts=256, top_k=8,
                        shared=1, dense_ffn=18432, vocab=129280, heads=128, kv_heads=128,
                        mla=dict(q_rank=1536, kv_rank=512, head_dim=128, rope=64),
                        published_total=671e9, published_active=37e9),
}  # fmt: skip


def _attention(m: dict[str, Any]) -> int:
    """One layer's attention parameters (``estimate.attention_param_count``): grouped-query, or
    DeepSeek's multi-head latent attention (query and joint K/V latents, a shared RoPE key)."""
    kw: dict[str, Any] = {"hidden": m["hidden"], "heads": m["heads"], "kv_heads": m["kv_heads"]}
    if m["mla"] is not None:
        mla = m["mla"]
        kw.update(kv_heads=m["heads"], head_dim=mla["head_dim"], q_lora_rank=mla["q_rank"])
        kw.update(kv_lora_rank=mla["kv_rank"], rope_head_dim=mla["rope"])
    return int(estimate.attention_param_count(**kw)["total"])


def architecture_params(name: str) -> dict[str, int]:
    """Parameters of a model in :data:`MODELS` by part (SwiGLU experts, no biases):
    ``experts`` (routed), ``shared`` (shared experts + dense-layer FFNs), ``router``,
    ``attention``, ``embeddings`` (input + output), ``norms``; with ``total`` and ``active``
    (routed experts counted top_k / experts)."""
    m = MODELS[name]
    h, n_moe = m["hidden"], m["moe_layers"]
    moe = estimate.moe_param_count(
        h, m["ffn"], m["experts"], top_k=m["top_k"], shared_experts=m["shared"],
        gated_mlp=True, layers=n_moe,
    )  # fmt: skip
    routed = n_moe * m["experts"] * moe["expert"]
    shared = n_moe * m["shared"] * moe["expert"] + (m["layers"] - n_moe) * 3 * h * m["dense_ffn"]
    parts = {
        "experts": routed,
        "shared": shared,
        "router": n_moe * moe["router"],
        "attention": m["layers"] * _attention(m),
        "embeddings": 2 * m["vocab"] * h,
        "norms": (2 * m["layers"] + 1) * h,
    }
    total = sum(parts.values())
    active = total - routed + routed * m["top_k"] // m["experts"]
    return {**parts, "total": total, "active": active}


@dataclass(frozen=True)
class ScaleRow:
    """:func:`scale`: one (model, ep, GPUs) at scale; the model-state GiB per GPU of each
    pipeline depth follow ``gpus`` in columns ``GiB_per_gpu_pp{stages}``."""

    model: str
    total_B: float
    published_total_B: float
    active_B: float
    active_no_embed_B: float
    published_active_B: float
    ep: int
    gpus: int
    a2a_KiB_per_token_layer: float


def scale(
    layouts: tuple[tuple[str, int, int], ...] = (
        ("Mixtral 8x7B", 8, 128),
        ("DeepSeek-V3", 64, 2048),
    ),
    *,
    stage: int = 1,
    stages: tuple[int, ...] = (1, 16),
) -> pd.DataFrame:
    """Each (model, ep, GPUs): parameters total and active (B) beside the published numbers,
    with and without embeddings; model-state GiB per GPU under EP x ZeRO ``stage`` (bf16
    weights and gradients, fp32 Adam states and master weights: 2 + 2 + 12 B per parameter,
    ``estimate.moe_model_state_bytes_per_rank``) for each pipeline depth in ``stages``; and
    the all-to-all KiB one GPU sends per token and MoE layer (bf16, uniform routing,
    ``estimate.ep_all_to_all_bytes_per_token``)."""
    rows, per_depth = [], []
    for name, ep, gpus in layouts:
        p = architecture_params(name)
        m = MODELS[name]
        a2a = estimate.ep_all_to_all_bytes_per_token(m["hidden"], ep=ep, top_k=m["top_k"]) / 1024
        rows.append(ScaleRow(
            name, p["total"] / 1e9, m["published_total"] / 1e9, p["active"] / 1e9,
            (p["active"] - p["embeddings"]) / 1e9, m["published_active"] / 1e9, ep, gpus, a2a,
        ))  # fmt: skip
        per_depth.append([estimate.moe_model_state_bytes_per_rank(
            p["total"] - p["experts"], p["experts"], ep=ep, world_size=gpus, stage=stage, stages=pp
        )["total"] / 2**30 for pp in stages])  # fmt: skip
    df = kit.frame(rows, ScaleRow)
    for i, pp in enumerate(stages):  # after gpus, one column per depth
        df.insert(8 + i, f"GiB_per_gpu_pp{pp}", [gib[i] for gib in per_depth])
    return df
