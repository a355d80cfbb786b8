"""When communication hides: the overlap threshold of every parallelism.

Each threshold compares the time a GPU computes with the time a link takes to move what that
computation needs, and so is the ratio of the card's FLOP/s to the link's bytes/s times a shape
factor (the FLOPs per byte the parallelism does). Arguments, in every function:

* ``peak_flops``: the card's dense tensor-core peak in FLOP/s *at the precision the matmuls run
  in* (``gpu_spec("H100").peak_flops`` = 989e12: bf16 dense, no sparsity); ``mfu`` (0-1] the
  share of it reached (default 1: the threshold at peak; a slower card hides more easily);
* ``link_GBps``: GB/s (1e9 bytes/s) **per direction** of the link that bounds the collective:
  ``link_speed("NVLink H100").per_direction_GBps`` = 450 inside a node, ``link_speed(
  "InfiniBand NDR").per_direction_GBps`` = 50 (one 400 Gb/s port per GPU) across nodes. A
  bidirectional headline (900 for NVLink) makes every threshold 2x too small;
* ``dtype_bytes`` / ``param_bytes`` / ``grad_bytes``: the width of what travels (2: bf16).

With F = peak_flops x mfu and B = link_GBps x 1e9, F/B is FLOPs per byte: 989e12 / 450e9 =
2,197.8 on NVLink, 989e12 / 50e9 = 19,780 over InfiniBand NDR. Matmul FLOPs only (2 per
multiply-add), attention scores left out except for ring attention: extra compute only makes
hiding easier, so each threshold errs on the safe side. "Hides" means the collective takes no
longer than the compute it can run beside; whether a framework overlaps them is another matter
(DDP's buckets, FSDP's prefetch do; tensor parallelism's all-reduces sit on the critical path
unless the matmul is split to overlap them).

Sources: Ultra-Scale Playbook (Tazi et al. 2025), Appendix A3 "Math for compute/communication
overlap"; Austin et al. 2025, "How to Scale Your Model", Part 3 (sharded matmuls) and Part 5
(parallelizing a Transformer for training: data parallelism is compute-bound when tokens per
device > C / W); Liu et al. 2023, "Ring Attention" (arXiv:2310.01889), Sec. 3 (block size >=
FLOPs / bandwidth); Huang et al. 2019 (GPipe) for the bubble. Introduced in
notebooks/09_data_parallelism.ipynb to notebooks/12_pipeline_parallelism.ipynb, gathered in
notebooks/14_planning_a_run.ipynb.
"""

from __future__ import annotations

import math

from course_lib import validate as _v
from course_lib.measure.estimate.compute import microbatches_for_bubble
from course_lib.measure.estimate.moe import ep_all_to_all_bytes_per_assignment

__all__ = [
    "dp_overlap_min_tokens",
    "fsdp_overlap_min_tokens",
    "tp_overlap_min_hidden",
    "pp_bubble_micro_batches",
    "pp_transfer_to_compute",
    "cp_ring_overlap_min_tokens",
    "ep_overlap_min_tokens_per_expert",
]


def _flops_per_byte(peak_flops: float, link_GBps: float, mfu: float) -> float:
    """F / B in FLOPs per byte: achieved FLOP/s over the link's bytes/s per direction."""
    f = _v.number("peak_flops", peak_flops, positive=True, finite=True)
    b = _v.number("link_GBps", link_GBps, positive=True, finite=True) * 1e9
    return f * _v.number("mfu", mfu, positive=True, maximum=1) / b


def dp_overlap_min_tokens(
    *,
    world_size: int,
    peak_flops: float,
    link_GBps: float,
    grad_bytes: int = 2,
    mfu: float = 1.0,
) -> float:
    """Tokens per GPU (in the backward the reduce runs beside) above which data parallelism's
    gradient all-reduce hides behind backward: (F/B) (N-1)/N grad_bytes / 2 tokens.

    Derivation, N' parameters, T tokens per GPU: backward does 4 N' T FLOPs (the gradients of
    input and weight of every matmul, 2 x forward's 2 N' T), taking 4 N' T / F seconds; the ring
    all-reduce sends 2 (N-1)/N N' grad_bytes bytes per rank (``world_size`` = N), taking that
    over B. Equal at T = (F/B) (N-1)/N grad_bytes / 2; N' cancels, so the threshold holds per
    bucket as for the whole model. bf16 gradients on an H100: 19,780 x 7/8 = 17,307.5 tokens at
    N = 8 over one 50 GB/s InfiniBand port, 2,197.8 x 7/8 = 1,923.1 over NVLink; towards F/B as
    N grows (Austin et al., Part 5: B/X > C/W). Under gradient accumulation the reduce overlaps
    only the last micro-batch's backward: T is that micro-batch's tokens."""
    n = _v.count("world_size", world_size, minimum=1)
    g = _v.count("grad_bytes", grad_bytes, minimum=1)
    return _flops_per_byte(peak_flops, link_GBps, mfu) * (n - 1) / n * g / 2


def fsdp_overlap_min_tokens(
    *,
    world_size: int,
    peak_flops: float,
    link_GBps: float,
    param_bytes: int = 2,
    grad_bytes: int = 2,
    mfu: float = 1.0,
) -> float:
    """Tokens per GPU above which FSDP / ZeRO-3's collectives hide: the larger of forward's
    and backward's threshold, (F/B) (N-1)/N max(p/2, (p+g)/4) tokens (p = ``param_bytes``, the
    width gathered; g = ``grad_bytes``, the width reduce-scattered).

    Per layer of N' parameters and T tokens per GPU: forward gathers the layer, (N-1)/N N' p
    bytes per rank, beside the previous layer's 2 N' T FLOPs: T >= (F/B) (N-1)/N p / 2;
    backward gathers it again and reduce-scatters its gradient, (N-1)/N N' (p + g) bytes,
    beside 4 N' T FLOPs: T >= (F/B) (N-1)/N (p + g) / 4. With bf16 both (p = g = 2) the two are
    equal and equal to data parallelism's (:func:`dp_overlap_min_tokens`): the same bytes, since
    an all-reduce is a reduce-scatter plus an all-gather (Playbook A3; Austin et al., Part 5).
    An FP8 gather (p = 1) leaves backward's (1 + 2) / 4 = 0.75 binding."""
    n = _v.count("world_size", world_size, minimum=1)
    p = _v.count("param_bytes", param_bytes, minimum=1)
    g = _v.count("grad_bytes", grad_bytes, minimum=1)
    per = max(p / 2, (p + g) / 4)
    return _flops_per_byte(peak_flops, link_GBps, mfu) * (n - 1) / n * per


def tp_overlap_min_hidden(
    *,
    tp: int,
    peak_flops: float,
    link_GBps: float,
    tokens: int | None = None,
    alpha_s: float = 0.0,
    dtype_bytes: int = 2,
    mfu: float = 1.0,
) -> float:
    """Hidden size h at which a transformer layer's tensor-parallel all-reduces take no longer
    than its matmuls (forward, the binding phase: backward has twice the FLOPs, the same
    bytes): (F/B) (t-1) dtype_bytes / 6 when the latency ``alpha_s`` is left out.

    Per layer, T = ``tokens`` per GPU, t = ``tp``: forward's matmuls are 24 T h^2 / t FLOPs (a
    layer of 12 h^2 weights: 4 h^2 attention, an MLP of width 4h; a SwiGLU of width 8h/3 with
    grouped K/V is close to it), time 24 T h^2 / (t F); its 2 ring all-reduces of T h p bytes
    (Megatron's g after attention and after the MLP; sequence parallelism's all-gather plus
    reduce-scatter move the same) take 2 [2 (t-1) alpha + 2 (t-1)/t T h p / B]. T cancels from
    the bandwidth term: h >= (F/B) (t-1) p / 6, at t = 8 in bf16 5,128.2 over NVLink (H100) and
    46,153.3 over one 50 GB/s port: tensor parallelism across nodes never hides. With ``tokens``
    (and ``alpha_s`` > 0) the latency counts too: h is the positive root of 24 T h^2/(t F) =
    4 (t-1) alpha + 4 (t-1) T h p / (t B), larger than the bandwidth limit for few tokens.
    MLP only this is Austin et al.'s f / t > C / W (Part 3)."""
    t = _v.count("tp", tp, minimum=1)
    p = _v.count("dtype_bytes", dtype_bytes, minimum=1)
    ratio = _flops_per_byte(peak_flops, link_GBps, mfu)
    a = _v.number("alpha_s", alpha_s, minimum=0, finite=True)
    if tokens is None:
        if a > 0:
            raise ValueError(f"alpha_s = {a}: expected tokens too (latency counts per token)")
        return ratio * (t - 1) * p / 6
    n = _v.count("tokens", tokens, minimum=1)
    f = peak_flops * mfu
    bw = f / ratio  # bytes/s
    qa, qb, qc = 24 * n / (t * f), 4 * (t - 1) * n * p / (t * bw), 4 * (t - 1) * a
    return (qb + math.sqrt(qb * qb + 4 * qa * qc)) / (2 * qa)


def pp_bubble_micro_batches(stages: int, target: float, *, virtual_stages: int = 1) -> int:
    """Micro-batches m (per step, per pipeline) for a bubble, idle over the whole step, below
    ``target`` (a fraction in (0, 1)): the smallest m with (p-1)/(v m + p-1) < target, i.e.
    m > (p-1)(1 - target)/(v target) (Huang et al. 2019; interleaved, Narayanan et al. 2021).
    p = 8 stages, 5 %: m > 7 x 0.95 / 0.05 = 133, so 134; with v = 2 chunks per rank, 67.
    A number of micro-batches, not a rate: the bubble does not depend on the link."""
    p = _v.count("stages", stages, minimum=1)
    x = _v.number("target", target, positive=True, maximum=1)
    if x >= 1:
        raise ValueError(f"target = {target}: expected a fraction in (0, 1)")
    return microbatches_for_bubble(p, x, definition="fraction", virtual_stages=virtual_stages)


def pp_transfer_to_compute(
    *,
    hidden: int,
    layers: int,
    peak_flops: float,
    link_GBps: float,
    dtype_bytes: int = 2,
    mfu: float = 1.0,
) -> float:
    """Time to send one micro-batch's activation to the next stage over the time the stage
    computes it, forward (a ratio; below 1 the send hides behind the next micro-batch's compute):
    (F/B) dtype_bytes / (24 ``layers`` h).

    One micro-batch of T tokens sends T h p bytes (:func:`pipeline_boundary_bytes`), over B; a
    stage of L = ``layers`` layers computes 24 T h^2 L FLOPs (12 h^2 weights a layer), over F.
    T cancels. Llama 3 405B's width (h = 16,384) with 126 layers over 16 stages (8 a stage) on
    H100s over one 50 GB/s port: 19,780 x 2 / (24 x 8 x 16,384) = 0.0126, the send 1.3 % of the
    stage's compute; backward sends the gradient of the same size beside twice the FLOPs."""
    h = _v.count("hidden", hidden, minimum=1)
    n = _v.count("layers", layers, minimum=1)
    p = _v.count("dtype_bytes", dtype_bytes, minimum=1)
    return _flops_per_byte(peak_flops, link_GBps, mfu) * p / (24 * n * h)


def cp_ring_overlap_min_tokens(
    *,
    heads: int,
    peak_flops: float,
    link_GBps: float,
    kv_heads: int | None = None,
    tp: int = 1,
    causal: bool = False,
    dtype_bytes: int = 2,
    mfu: float = 1.0,
) -> float:
    """Tokens per rank n above which ring attention's K/V transfer hides behind its block
    compute: n >= (F/B) d_kv p / (2 d), doubled with ``causal`` (Liu et al. 2023, Sec. 3).

    Derivation. Each of the cp-1 ring steps a rank computes its n queries against a block of n
    keys while it passes that block on. d = (heads/tp) x head_dim is the query width on the
    rank, d_kv = (kv_heads/tp) x head_dim the width of K (and of V; one K/V head per rank when
    kv_heads < tp, replicated). Compute: Q K^T is 2 n^2 d FLOPs and P V another 2 n^2 d, time
    4 n^2 d / F. Transfer: K and V, 2 n d_kv p bytes, time 2 n d_kv p / B. Equal at n = (F/B)
    d_kv p / (2 d); head_dim cancels. Full multi-head attention (d_kv = d) in bf16: n = F/B,
    19,780 tokens per rank on an H100 over one 50 GB/s port, Liu et al.'s "block size >= F/B".
    Llama 3 405B (128 heads, 8 K/V heads) at tp = 8: 16 query heads and 1 K/V head per rank,
    d_kv/d = 1/16, n = 19,780 / 16 = 1,236.25. ``causal``: a zig-zag layout computes half of
    each step's block (two of its four half-size quarters), 2 n^2 d, so n doubles. Backward
    sends K, V and the dK, dV accumulators (twice the bytes) beside about twice the FLOPs: the
    same n."""
    a = _v.count("heads", heads, minimum=1)
    g = a if kv_heads is None else _v.count("kv_heads", kv_heads, minimum=1, maximum=a)
    t = _v.count("tp", tp, minimum=1)
    p = _v.count("dtype_bytes", dtype_bytes, minimum=1)
    if a % t:
        raise ValueError(f"heads = {a}: expected a multiple of tp = {t}")
    if g % t and t % g:
        raise ValueError(f"kv_heads = {g}: expected a multiple or a divisor of tp = {t}")
    share = max(g // t, 1) / (a // t)  # d_kv / d on one rank
    return _flops_per_byte(peak_flops, link_GBps, mfu) * share * p / 2 * (2 if causal else 1)


def ep_overlap_min_tokens_per_expert(
    *,
    hidden: int,
    ffn: int,
    experts: int,
    ep: int,
    peak_flops: float,
    link_GBps: float,
    alpha_s: float,
    gated_mlp: bool = False,
    dtype_bytes: int = 2,
    mfu: float = 1.0,
) -> float:
    """Tokens per expert c (assignments one expert receives per MoE layer, from every rank)
    at which the experts' matmuls take as long as the dispatch and combine all-to-alls; ``inf``
    when the bandwidth alone exceeds the compute (no batch hides it), 0 with ``ep`` = 1.

    Per rank, E/ep experts of c assignments: A = c E / ep rows. Compute: 2 P_e FLOPs a row
    (P_e = 2 h f, or 3 h f ``gated_mlp``), A 2 P_e / F. All-to-all, balanced routing: a share
    (ep-1)/ep of the rows travels, h p bytes each, in dispatch and again in combine
    (``ep_all_to_all_bytes_per_assignment``, forward), 2 (ep-1)/ep A h p / B, plus (ep-1)
    pairwise steps of ``alpha_s`` each for both. Per row the condition is 2 P_e / F >
    2 (ep-1)/ep h p / B, i.e. f > (F/B) (ep-1)/ep p / 2 (ungated; / 3 gated): the rows cancel,
    and only the latency sets a number of tokens,
    c = 2 (ep-1) alpha ep / (E (2 P_e/F - 2 (ep-1)/ep h p / B)). DeepSeek-V3's experts (h 7,168,
    f 2,048, SwiGLU) at ep = 64 in bf16: the all-to-all is (F/B) (63/64) 2 / (3 x 2,048) = 0.70
    of the expert compute over NVLink and 6.3x over one 50 GB/s port: across nodes it never
    hides, which is why that report overlaps two micro-batches and limits each token to 4 nodes.
    A token batch of T tokens per rank with top-k routing gives c = ep T k / E."""
    h, f = _v.count("hidden", hidden, minimum=1), _v.count("ffn", ffn, minimum=1)
    e = _v.count("experts", experts, minimum=1)
    n = _v.count("ep", ep, minimum=1, maximum=e)
    p = _v.count("dtype_bytes", dtype_bytes, minimum=1)
    a = _v.number("alpha_s", alpha_s, minimum=0, finite=True)
    if e % n:
        raise ValueError(f"experts = {e}: expected a multiple of ep = {n}")
    ratio = _flops_per_byte(peak_flops, link_GBps, mfu)
    if n == 1:
        return 0.0
    p_e = (3 if gated_mlp else 2) * h * f
    row = ep_all_to_all_bytes_per_assignment(h, dtype_bytes=p, backward=False)  # 2 h p
    margin = 2 * p_e - ratio * (n - 1) / n * row  # FLOPs per row the transfer leaves
    if margin <= 0:
        return math.inf
    f_eff = peak_flops * mfu
    return 2 * (n - 1) * a * f_eff / margin * n / e
