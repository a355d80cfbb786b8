"""A micro-batch's compute product by product: every matrix product of a layer on one rank, its
shape from the model and the layout, its time from ``estimate.gemm_time`` (the roofline of the
card's FLOP/s and memory bandwidth, at the fraction of the peak its GEMMs reach: measured on an
H100, ``estimate.GEMM_CALIBRATIONS``), and the memory-bound kernels between them (norms,
activations, residual adds, dropout, the softmax of materialized attention scores) at the
memory bandwidth. What ``Assumptions(matmul_model="by shape")`` prices instead of one efficiency
for every product. Introduced in notebooks/14_planning_a_run.ipynb.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

from course_lib.measure import estimate
from course_lib.measure.estimate.compute import GEMM_CALIBRATIONS, GemmCalibration
from course_lib.plan.specs import ClusterSpec, ModelSpec

__all__ = ["Gemm", "calibration", "layer_gemms", "elementwise_bytes", "LayerTime", "layer_time"]

#: the product groups of one layer (``layer_gemms``)
GROUPS = ("attention", "core", "mlp", "router", "experts", "output")


class Gemm(NamedTuple):
    """``batch`` (m x k) @ (k x n) products, moving ``extra_bytes`` besides their operands."""

    m: int
    n: int
    k: int
    batch: int = 1
    extra_bytes: float = 0.0


def calibration(cluster: ClusterSpec, fp8: bool = False) -> GemmCalibration:
    """The GEMM calibration of ``cluster``'s card: the measured ceiling of
    ``estimate.GEMM_CALIBRATIONS`` (the H100's, the FP8 one with ``fp8``) on this cluster's
    own peak (``fp8_flops`` with ``fp8``), memory bandwidth and SMs (0: no waves)."""
    base = GEMM_CALIBRATIONS["H100 fp8" if fp8 else "H100 bf16"]
    peak = cluster.fp8_flops if fp8 else cluster.peak_flops
    return base._replace(peak_flops=peak, mem_bandwidth=cluster.mem_GBps * 1e9, sms=cluster.sms)


def _attention_gemms(model: ModelSpec, tp: int, t: int) -> list[Gemm]:
    """The attention projections of ``t`` tokens on one of ``tp`` ranks (K/V heads replicated
    where tp > kv_heads; MLA's down-projections split like the rest)."""
    h, a, d, dv = model.hidden, model.heads, model.head_dim, model.v_dim
    if model.mla:
        r, rq, rkv = model.rope_head_dim, model.q_lora_rank, model.kv_lora_rank
        q = (
            [Gemm(t, rq, h), Gemm(t, a * (d + r) // tp, rq)]
            if rq
            else [Gemm(t, a * (d + r) // tp, h)]
        )
        kv = [Gemm(t, -(-(rkv + r) // tp), h), Gemm(t, a * (d + dv) // tp, rkv)]
        return [*q, *kv, Gemm(t, h, a * dv // tp)]
    kv_heads = max(1, model.kv_heads // tp)
    return [Gemm(t, a * d // tp, h), Gemm(t, 2 * kv_heads * d, h), Gemm(t, h, a * dv // tp)]


def _mlp(t: int, h: int, width: int, gated: bool, count: int = 1) -> list[Gemm]:
    return [Gemm(t, (2 if gated else 1) * width, h, count), Gemm(t, h, width, count)]


@functools.cache
def layer_gemms(
    model: ModelSpec,
    tp: int,
    ep: int,
    tokens: int,
    queries: int,
    flash: bool,
    capacity_factor: float = 1.0,
    etp: int = 0,
) -> dict[str, list[Gemm]]:
    """The forward products of one layer on one rank, by group (:data:`GROUPS`): ``tokens``
    the rank's tokens (micro-batch x seq / cp), ``queries`` a sequence's queries on it (seq /
    cp) against seq keys. ``core``: Q K^T and A V of each head and sequence (tp splits the
    heads) as one product over the queries x keys scores, of depth query-key + value width
    (their FLOPs; the tiles of both run over the scores, as FlashAttention fuses them); unless
    ``flash``, the scores go to memory and back (2 bytes each way). An MoE
    layer: the router (h x E), the shared experts as one MLP, and the routed experts as a
    grouped GEMM, each of the E / ep local experts taking ep x tokens x top_k / E rows (even
    routing) times ``capacity_factor`` (the busiest rank's, which the others wait for), its
    width split over tp. Folded (``etp`` >= 1, ``course_lib.dims``): ep x etp ranks each bring
    tokens / tp, so an expert takes ep etp tokens top_k / (tp E) rows, its width split over
    etp."""
    h, a, s, t = model.hidden, model.heads, model.seq, tokens
    seqs, heads = max(1, tokens // queries), max(1, a // tp)
    qk, dv = model.head_dim + model.rope_head_dim, model.v_dim
    scores = 0.0 if flash else 2 * 2 * queries * s * heads * seqs
    out: dict[str, list[Gemm]] = {
        "attention": _attention_gemms(model, tp, t),
        "core": [Gemm(queries, s, qk + dv, heads * seqs, scores)],
        "output": [Gemm(t, -(-model.vocab // tp), h)],
    }
    if not model.experts:
        return out | {
            "mlp": _mlp(t, h, model.ffn // tp, model.gated_mlp),
            "router": [],
            "experts": [],
        }
    local, split = model.experts // ep, etp or tp
    rows = math.ceil(capacity_factor * ep * split * t * model.top_k / (tp * model.experts))
    shared = model.shared_experts * model.expert_ffn // tp
    return out | {
        "mlp": _mlp(t, h, shared, model.gated_mlp) if shared else [],
        "router": [Gemm(t, model.experts, h)],
        "experts": _mlp(rows, h, max(1, model.expert_ffn // split), model.gated_mlp, local),
    }


def elementwise_bytes(model: ModelSpec, tp: int, sequence_parallel: bool, flash: bool) -> float:
    """Bytes per token of one layer's memory-bound kernels in the forward pass on one rank, each
    reading its inputs and writing its output once in bf16: the norms (2 x 2 h, one per
    parallel block), the residual adds with their dropout (3 x 2 h + h of mask each), the MLP's
    activation (GeLU: 2 x 2 f; SwiGLU: 3 x 2 f), and without ``flash`` the softmax of the
    scores (2 x 2 a s) and their dropout (2 x 2 a s + a s). tp splits the MLP and the scores,
    and with ``sequence_parallel`` the rest. An MoE layer's MLP width is what a token uses, and
    it adds its router's fp32 scores (2 x 4 E: softmax and top-k) and the token permutation
    and unpermutation (each reads a token's row and writes its top_k copies, or back: 2 x 2 x
    2 h (1 + top_k)), Megatron-Core's permute / unpermute around the grouped GEMM."""
    h, a, s = model.hidden, model.heads, model.seq
    f = (model.top_k + model.shared_experts) * model.expert_ffn if model.experts else model.ffn
    blocks = 1 if model.parallel_block else 2
    rest = blocks * 4 * h + 2 * (6 * h + (h if model.dropout else 0))
    split = (6 if model.gated_mlp else 4) * f
    if not flash:
        split += a * s * (4 + (5 if model.dropout else 0))
    if model.experts:  # router scores (fp32 softmax, top-k), permute and unpermute the copies
        rest += 2 * 4 * model.experts + 2 * 2 * 2 * h * (1 + model.top_k)
    return rest / (tp if sequence_parallel else 1) + split / tp


class LayerTime(NamedTuple):
    """Seconds of one layer's forward on one rank, by part; ``expert_efficiency``: the fraction
    of the peak its routed-expert products reach (nan for a dense layer)."""

    weights: float
    core: float
    elementwise: float
    output: float
    expert_efficiency: float


@functools.cache
def layer_time(
    model: ModelSpec,
    cluster: ClusterSpec,
    tp: int,
    ep: int,
    tokens: int,
    queries: int,
    flash: bool,
    sequence_parallel: bool,
    fp8: bool,
    capacity_factor: float = 1.0,
    etp: int = 0,
) -> LayerTime:
    """:class:`LayerTime` of one layer (and of the output layer) in the forward pass: weight
    products at the FP8 calibration with ``fp8``, the attention core in bf16, the memory-bound
    kernels at the memory bandwidth."""
    gemms = layer_gemms(model, tp, ep, tokens, queries, flash, capacity_factor, etp)
    weight_card, bf16 = calibration(cluster, fp8), calibration(cluster)

    def seconds(group: str, card: GemmCalibration) -> float:
        return sum(
            estimate.gemm_time(g.m, g.n, g.k, card, batch=g.batch, extra_bytes=g.extra_bytes)
            for g in gemms[group]
        )

    weights = sum(seconds(g, weight_card) for g in ("attention", "mlp", "router", "experts"))
    experts = gemms["experts"]
    eff = float("nan")
    if experts:
        flops = sum(2 * g.m * g.n * g.k * g.batch for g in experts)
        eff = flops / (seconds("experts", weight_card) * weight_card.peak_flops)
    moved = tokens * elementwise_bytes(model, tp, sequence_parallel, flash)
    return LayerTime(
        weights,
        seconds("core", bf16),
        moved / (cluster.mem_GBps * 1e9),
        seconds("output", weight_card),
        eff,
    )
