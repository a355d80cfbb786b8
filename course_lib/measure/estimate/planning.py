"""Formulas for planning a run at scale: parameter counts of real architectures, what a pipeline
keeps in flight and GPU-days (tensor-parallel traffic: ``tensor_parallel``; activations per layer:
``activations.activation_bytes_transformer_layer``; FLOPs: ``training.training_flops_per_token``
and ``checkpointing.recompute_flops_per_token``).

Introduced in notebooks/14_planning_a_run.ipynb. Everything is in bytes, FLOPs, seconds, as in
the rest of ``estimate``; "GB" is 1e9 bytes.
"""

from __future__ import annotations

from course_lib import validate as _v
from course_lib.shape import NORMS, Norm

__all__ = [
    "NORMS",
    "Norm",
    "attention_param_count",
    "transformer_param_count",
    "pipeline_inflight_layers",
    "gpus_for_days",
    "gpu_hours",
]

# Norm, NORMS: the norms a shape may have (defined with course_lib.shape.ModelShape)


def attention_param_count(
    *,
    hidden: int,
    heads: int,
    kv_heads: int,
    head_dim: int = 0,
    bias: bool = False,
    qk_norm: bool = False,
    q_lora_rank: int = 0,
    kv_lora_rank: int = 0,
    rope_head_dim: int = 0,
    v_head_dim: int = 0,
) -> dict[str, int]:
    """Parameters of one attention block (no input norm), by part, for h = hidden, a heads of
    d = ``head_dim`` (0: h / a), g = ``kv_heads``, d_v = ``v_head_dim`` (0: d):

    * multi-head, grouped-query, multi-query attention: ``q`` h a d, ``kv`` 2 h g d, ``o``
      a d h; biases (``bias``) a d + 2 g d + h; ``qk_norm`` (Qwen3) 2 d;
    * multi-head latent attention (``kv_lora_rank`` r_kv > 0; DeepSeek-AI 2024,
      arXiv:2405.04434 Sec. 2.1, and arXiv:2412.19437 Sec. 2.1.1): queries from a latent of
      r_q = ``q_lora_rank`` (h r_q + its norm r_q + r_q a (d + r), r = ``rope_head_dim``; with
      r_q = 0 a full h a (d + r)), ``kv``: the joint down-projection with the shared RoPE key
      h (r_kv + r), its norm r_kv, K and V up-projections r_kv a (d + d_v); ``o`` a d_v h.

    ``kv`` is the part tensor parallelism replicates when tp > kv_heads (each rank keeps whole
    K/V heads). Returns ``{"q", "kv", "o", "other", "total"}``. DeepSeek-V3 (h 7168, 128 heads
    of 128 + 64, r_q 1536, r_kv 512): 187,107,328 per layer."""
    h, a = _v.count("hidden", hidden, minimum=1), _v.count("heads", heads, minimum=1)
    g = _v.count("kv_heads", kv_heads, minimum=1, maximum=a)
    d = _v.count("head_dim", head_dim, minimum=0) or h // a
    dv = _v.count("v_head_dim", v_head_dim, minimum=0) or d
    r_q, r_kv, r = (
        _v.count(n, x, minimum=0)
        for n, x in (("q_lora_rank", q_lora_rank), ("kv_lora_rank", kv_lora_rank),
                     ("rope_head_dim", rope_head_dim))
    )  # fmt: skip
    if r_kv:
        q = (h * r_q + r_q + r_q * a * (d + r)) if r_q else h * a * (d + r)
        kv = h * (r_kv + r) + r_kv + r_kv * a * (d + dv)
    else:
        q, kv = h * a * d, 2 * h * g * d
    o = a * dv * h
    other = ((a * d + 2 * g * d + h) if bias else 0) + (2 * d if qk_norm else 0)
    return {"q": q, "kv": kv, "o": o, "other": other, "total": q + kv + o + other}


def transformer_param_count(
    *,
    layers: int,
    hidden: int,
    heads: int,
    kv_heads: int,
    ffn: int,
    vocab: int,
    seq: int = 0,
    gated_mlp: bool = True,
    bias: bool = False,
    tied_embeddings: bool = False,
    learned_positions: bool = False,
    norm: Norm = "rmsnorm",
    embedding_norm: bool = False,
    head_dim: int = 0,
    qk_norm: bool = False,
    parallel_block: bool = False,
    q_lora_rank: int = 0,
    kv_lora_rank: int = 0,
    rope_head_dim: int = 0,
    v_head_dim: int = 0,
) -> dict[str, int]:
    """Exact parameter count of a decoder-only transformer, by part.

    Per layer (h = hidden, f = ffn, k = kv_heads * h / heads, the width of K and of V):
    attention q and o projections 2 h^2, k and v projections 2 h k (grouped-query attention,
    Ainslie et al. 2023, arXiv:2305.13245; k = h for multi-head attention); MLP 3 h f when gated
    (SwiGLU: gate, up, down; Shazeer 2020, arXiv:2002.05202) else 2 h f; biases (``bias``)
    h + 2k + h + (2f or f) + h; two norms, h each (RMSNorm, or a LayerNorm without bias as
    nanoGPT's ``bias=False``) or 2h (LayerNorm with its bias, when ``bias``).
    Outside the layers: token embedding V h, an output matrix V h unless ``tied_embeddings``,
    learned positions seq * h, a final norm, and an embedding norm (BLOOM) when asked.

    With h = 4096, f = 11008, 32 layers, V = 32000, gated, untied, RMSNorm this is
    6,738,415,616 (Llama-2-7B); GPT-3's shape gives 12 L h^2 + ... = 174.6e9 ("175B").
    A shape's fields go in as they are: ``transformer_param_count(**shape.dense())``
    (``course_lib.shape.ModelShape``; ``GPTConfig.shape()``, ``LlamaConfig.shape()``).
    Attention of any shape (``head_dim`` apart from h / a, grouped- or multi-query, ``qk_norm``,
    multi-head latent attention) is :func:`attention_param_count`'s; ``parallel_block`` (PaLM)
    keeps one norm per layer. PaLM 540B (118 layers, h 18432, 48 heads of 256, one K/V head,
    f 73728, V 256,000, tied, no biases): 540,356,474,880 (its Table 1: 540.35B).
    Returns ``{"per_layer", "layers", "embedding", "output", "other", "total"}`` (ints).
    """
    L = _v.count("layers", layers, minimum=1)
    h, a = _v.count("hidden", hidden, minimum=1), _v.count("heads", heads, minimum=1)
    g = _v.count("kv_heads", kv_heads, minimum=1, maximum=a)
    f, V = _v.count("ffn", ffn, minimum=1), _v.count("vocab", vocab, minimum=1)
    s = _v.count("seq", seq)
    norm = _v.choice("norm", norm, NORMS)
    if (h % a and not head_dim) or a % g:
        raise ValueError(
            f"hidden = {h}, heads = {a}, kv_heads = {g}: expected heads to divide "
            "hidden (or a head_dim) and kv_heads to divide heads"
        )
    norm_params = 2 * h if norm == "layernorm" and bias else h
    attention = attention_param_count(
        hidden=h, heads=a, kv_heads=g, head_dim=head_dim, bias=bias, qk_norm=qk_norm,
        q_lora_rank=q_lora_rank, kv_lora_rank=kv_lora_rank, rope_head_dim=rope_head_dim,
        v_head_dim=v_head_dim,
    )["total"]  # fmt: skip
    mlp = (3 if gated_mlp else 2) * h * f + (((2 * f) if gated_mlp else f) + h if bias else 0)
    per_layer = attention + mlp + (1 if parallel_block else 2) * norm_params
    embedding, output = V * h, (0 if tied_embeddings else V * h)
    other = (
        norm_params + (s * h if learned_positions else 0) + (norm_params if embedding_norm else 0)
    )
    total = L * per_layer + embedding + output + other
    parts = dict(per_layer=per_layer, layers=L * per_layer, embedding=embedding, output=output)
    return parts | {"other": other, "total": total}


def pipeline_inflight_layers(
    layers_per_stage: int, stages: int, microbatches: int, virtual_stages: int = 1
) -> int | float:
    """Layers' worth of activations (for one micro-batch) the first pipeline rank keeps at its
    peak, under 1F1B (PipeDream-Flush, Narayanan et al. 2021, arXiv:2006.09503) or its
    interleaved form (Narayanan et al. 2021, arXiv:2104.04473).

    1F1B: the first stage runs min(m, p) forwards before its first backward, each of its
    ``layers_per_stage`` layers: min(m, p) * L/p -- all L layers of the model for m >= p
    (Korthikanti et al. 2022, Sec. 4.2.3). Interleaved with v chunks per rank: Megatron's warm-up
    runs (p - 1) * 2 + (v - 1) * p chunk forwards before the first backward, so v p + p - 1
    chunks of L/(p v) layers are alive (at most m v): L (1 + (p - 1) / (p v)) for large m.
    """
    n = _v.count("layers_per_stage", layers_per_stage, minimum=1)
    p = _v.count("stages", stages, minimum=1)
    m = _v.count("microbatches", microbatches, minimum=1)
    v = _v.count("virtual_stages", virtual_stages, minimum=1)
    if v == 1:
        return min(m, p) * n
    if n % v:
        raise ValueError(f"virtual_stages = {v}: expected a divisor of layers_per_stage = {n}")
    chunks = min(m * v, v * p + p - 1) if p > 1 else 1
    return chunks * n // v


def gpus_for_days(total_flops: float, *, days: float, peak_flops: float, mfu: float) -> float:
    """GPUs needed to do ``total_flops`` in ``days`` at ``mfu`` of ``peak_flops`` (FLOP/s):
    F / (days * 86400 * mfu * peak). 3.15e23 FLOPs (175B x 300B tokens) in 30 days at 50 % MFU:
    1,944 V100 (125 TFLOP/s), 779 A100 (312), 246 H100 (989)."""
    f = _v.number("total_flops", total_flops, positive=True)
    d = _v.number("days", days, positive=True)
    u = _v.number("mfu", mfu, positive=True, maximum=1)
    return f / (d * 86400 * u * _v.number("peak_flops", peak_flops, positive=True))


def gpu_hours(total_flops: float, *, peak_flops: float, mfu: float) -> float:
    """GPU-hours to do ``total_flops`` at ``mfu`` of ``peak_flops``: F / (3600 mfu peak).
    7B x 2T tokens = 8.4e22 FLOPs: 47,200 H100-hours at 50 %."""
    f = _v.number("total_flops", total_flops, positive=True)
    u = _v.number("mfu", mfu, positive=True, maximum=1)
    return f / (3600 * u * _v.number("peak_flops", peak_flops, positive=True))
