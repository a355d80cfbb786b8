"""Per-GPU memory of one layout, by category, and the checks that refuse impossible layouts.

Every number comes from ``course_lib.measure.estimate``: model state from
``zero_state_breakdown_per_rank`` (2 + 2 + 12 bytes per parameter: bf16 weights and gradients,
fp32 master and Adam moments, as the ZeRO paper counts), activations from
``activation_bytes_transformer_layer`` (Korthikanti et al. 2022) times the layers a pipeline keeps
in flight (``pipeline_inflight_layers``). Introduced in notebooks/14_planning_a_run.ipynb.
"""

from __future__ import annotations

import functools
import math
from typing import Any

from course_lib import validate as _v
from course_lib.measure import estimate
from course_lib.measure.estimate.activations import Recompute
from course_lib.plan.specs import ClusterSpec, Layout, ModelSpec, divisors

__all__ = [
    "MEMORY_CATEGORIES",
    "check_layout",
    "layers_per_stage",
    "stage_layers",
    "microbatches",
    "predict_memory",
    "worst_stage_memory",
]

#: the categories of :func:`predict_memory`, in plotting order
MEMORY_CATEGORIES = ("params", "grads", "optimizer", "activations", "logits", "buffers")


def layers_per_stage(model: ModelSpec, pp: int, *, uneven_stages: bool = False) -> int:
    """Layers on the fullest pipeline stage: L / pp, or with ``uneven_stages`` the first count of
    :func:`stage_layers` (at least ceil(L / pp); BLOOM put 70 layers on 12 stages, Llama 3 126 on
    16). The one count the search, the checks and the predictions use."""
    return stage_layers(model, pp, uneven_stages=uneven_stages)[0]


def stage_layers(model: ModelSpec, pp: int, *, uneven_stages: bool = False) -> tuple[int, int]:
    """(layers on the first stage, the fullest, and on every middle stage, layers on the last).

    Even split: (L/pp, L/pp), the last stage also runs the output layer. With ``uneven_stages``
    the last stage gets fewer layers to make room for the output layer, which costs
    w = V h / P_layer layers' worth of FLOPs: the smallest n with (pp - 1) n + floor(n - w) >= L,
    the last stage taking what is left. BLOOM-176B (w = 1.46) on 12 stages: 6 layers per stage,
    4 on the last; Llama 3 405B (w = 0.66) on 16: 8, and 6 on the last (Llama 3 took one layer
    off the first and the last stage, arXiv:2407.21783 Sec. 3.3.2). Where n layers on each of
    pp - 1 stages would leave none for the last (80 layers on 13 stages: 12 x 7 = 84), the last
    stage keeps one layer and the others share the rest, the fullest holding
    ceil((L - 1) / (pp - 1)). Refused: pp > L (a stage with no layer), and without
    ``uneven_stages`` a pp that does not divide L.
    """
    p = _v.count("pp", pp, minimum=1)
    if p > model.layers:
        raise ValueError(
            f"pp = {p}: expected at most layers = {model.layers} (every pipeline stage holds "
            "at least one layer)"
        )
    if model.layers % p and not uneven_stages:
        raise ValueError(
            f"pp = {p}: expected a divisor of layers = {model.layers}: one of "
            f"{', '.join(map(str, divisors(model.layers)))} (or pass "
            "uneven_stages=True to let some stages hold one layer fewer)"
        )
    return _stage_layers(model, p)


@functools.cache
def _stage_layers(model: ModelSpec, pp: int) -> tuple[int, int]:
    """:func:`stage_layers` of a valid pp, counted once per (model, pp)."""
    layers = model.layers
    if layers % pp == 0:
        return layers // pp, layers // pp
    w = model.vocab * model.hidden / model.params()["per_layer"]
    lo, hi = -(-layers // pp), layers  # the smallest n that fits, by bisection
    while lo < hi:
        mid = (lo + hi) // 2
        if (pp - 1) * mid + max(0, math.floor(mid - w)) >= layers:
            hi = mid
        else:
            lo = mid + 1
    if layers - (pp - 1) * lo < 1:  # no layer left for the last stage
        return -(-(layers - 1) // (pp - 1)), 1
    return lo, layers - (pp - 1) * lo


def microbatches(model: ModelSpec, layout: Layout, global_batch_tokens: int) -> int:
    """Micro-batches per step on each pipeline: global batch in sequences / (dp x micro_batch);
    refuses a batch that does not divide."""
    tokens = _v.count("global_batch_tokens", global_batch_tokens, minimum=1)
    if tokens % model.seq:
        raise ValueError(
            f"global_batch_tokens = {tokens}: expected a multiple of seq = "
            f"{model.seq} (whole sequences)"
        )
    seqs = tokens // model.seq
    per = layout.dp * layout.micro_batch
    if seqs % per:
        ok = [d for d in divisors(seqs) if d * layout.micro_batch <= seqs][:12]
        raise ValueError(
            f"global batch = {seqs} sequences: expected a multiple of dp x "
            f"micro_batch = {layout.dp} x {layout.micro_batch} = {per}; dp dividing "
            f"{seqs // layout.micro_batch if seqs % layout.micro_batch == 0 else seqs}"
            f" at this micro_batch: one of {', '.join(map(str, ok))}, ..."
        )
    return seqs // per


@functools.cache
def tp_choices(model: ModelSpec) -> list[int]:
    """The tensor-parallel sizes ``model`` allows: divisors of the heads that divide the K/V
    heads, or that the K/V heads divide (each rank then keeps one whole K/V head, replicated
    tp / kv_heads times: ``ModelSpec.kv_replicated`` prices it). Multi-query attention (PaLM)
    allows every divisor of the heads."""
    g = model.kv_heads
    return [t for t in divisors(model.heads) if g % t == 0 or t % g == 0]


def check_layout(
    model: ModelSpec,
    layout: Layout,
    cluster: ClusterSpec | None = None,
    *,
    global_batch_tokens: int | None = None,
    uneven_stages: bool = False,
) -> None:
    """Refuse a layout that cannot run, naming the parameter, its value and the valid choices:
    tp must divide heads, and divide kv_heads or be a multiple of it (:func:`tp_choices`); pp
    must divide layers (unless ``uneven_stages``) and may
    not exceed them; v must divide the layers of a stage (as :func:`stage_layers` counts them,
    as the search does); the layout may not use more GPUs than the cluster has; the
    global batch must split into whole micro-batches; an interleaved pipeline needs at least as
    many micro-batches as stages."""
    if not isinstance(model, ModelSpec):
        raise TypeError(f"model = {model!r}: expected a ModelSpec")
    if not isinstance(layout, Layout):
        raise TypeError(f"layout = {layout!r}: expected a Layout")
    ok = tp_choices(model)
    if layout.tp not in ok:
        also = (
            "" if model.kv_heads == model.heads else " (or a multiple of kv_heads: K/V replicated)"
        )
        raise ValueError(
            f"tp = {layout.tp}: expected a divisor of heads = {model.heads} and "
            f"kv_heads = {model.kv_heads}{also}: one of {', '.join(map(str, ok))}"
        )
    n = layers_per_stage(model, layout.pp, uneven_stages=uneven_stages)
    if n % layout.virtual_stages:
        raise ValueError(
            f"virtual_stages = {layout.virtual_stages}: expected a divisor of the "
            f"{n} layers of a stage: one of {', '.join(map(str, divisors(n)))}"
        )
    _check_cp_ep(model, layout)
    if cluster is not None and layout.gpus > cluster.gpus:
        dims = "dp x tp x pp" + (" x cp" if layout.cp > 1 else "")
        sizes = [layout.dp, layout.tp, layout.pp] + ([layout.cp] if layout.cp > 1 else [])
        raise ValueError(
            f"{dims} = {' x '.join(map(str, sizes))} = {layout.gpus}"
            f" GPUs: expected at most the cluster's {cluster.gpus} "
            f"({cluster.nodes} nodes x {cluster.gpus_per_node})"
        )
    if global_batch_tokens is not None:
        m = microbatches(model, layout, global_batch_tokens)
        if layout.virtual_stages > 1 and m < layout.pp:
            raise ValueError(
                f"virtual_stages = {layout.virtual_stages}: expected 1 with "
                f"{m} micro-batches < pp = {layout.pp} (the interleaved schedule "
                "needs at least as many micro-batches as stages)"
            )


def _check_cp_ep(model: ModelSpec, layout: Layout) -> None:
    """cp must divide the sequence; ep > 1 needs experts, and must divide them."""
    if model.seq % layout.cp:
        raise ValueError(f"cp = {layout.cp}: expected a divisor of seq = {model.seq}")
    if layout.ep > 1 and (not model.experts or model.experts % layout.ep):
        raise ValueError(
            f"ep = {layout.ep}: expected a divisor of the {model.experts} experts"
            + ("" if model.experts else " (a dense model: ep = 1)")
        )


def predict_memory(
    model: ModelSpec,
    layout: Layout,
    *,
    global_batch_tokens: int | None = None,
    uneven_stages: bool = False,
    stage: str = "worst",
) -> dict[str, int | float]:
    """Bytes one GPU holds at its peak under ``layout``, by category (:data:`MEMORY_CATEGORIES`)
    plus ``total``. ``stage``: "first" (the embedding, and the most micro-batches in flight),
    "last" (the output layer and its logits, one micro-batch in flight) or "worst" (the larger).

    * params / grads / optimizer: the stage's parameters over tp, under ZeRO ``zero`` over dp
      (``estimate.zero_state_breakdown_per_rank``, K = 12: fp32 master + Adam moments);
    * activations: one layer's bytes (``estimate.activation_bytes_transformer_layer`` at the
      micro-batch) times the layers in flight on that stage
      (``estimate.pipeline_inflight_layers``; the last stage keeps one micro-batch); with
      ``full`` recomputation, plus one layer rebuilt during its backward;
    * logits: the last stage's fp32 logits for the loss, 4 s b V / tp;
    * buffers: ZeRO-3's gathered weights of two layers (the one running, the one prefetched),
      a rank's own experts only (:func:`_zero3_buffers`).

    Without ``global_batch_tokens`` the pipeline is assumed full (at least pp micro-batches).
    Not counted: the CUDA context, NCCL and allocator fragmentation (the planner leaves a
    reserve for them), temporaries inside a kernel.
    """
    check_layout(
        model, layout, global_batch_tokens=global_batch_tokens, uneven_stages=uneven_stages
    )
    which = _v.choice("stage", stage, ("worst", "first", "last"))
    m = (
        microbatches(model, layout, global_batch_tokens)
        if global_batch_tokens is not None
        else layout.pp * max(1, layout.virtual_stages)
    )
    if which == "worst":
        return worst_stage_memory(model, layout, m, uneven_stages, {})
    return _stage_memory(model, layout, m, uneven_stages, which, {})


def worst_stage_memory(
    model: ModelSpec, layout: Layout, m: int, uneven_stages: bool, memo: dict[Any, Any]
) -> dict[str, int | float]:
    """:func:`predict_memory` of the fuller stage, first or last, of a checked layout with
    ``m`` micro-batches, each counted once. ``memo`` keeps what the layouts of one search share
    (a stage's parameters, one layer's activations; ``plan.plan`` passes one per search); a
    fresh ``memo`` counts everything again."""
    first, last = (
        _stage_memory(model, layout, m, uneven_stages, one, memo) for one in ("first", "last")
    )
    return first if first["total"] >= last["total"] else last


def _stage_memory(
    model: ModelSpec,
    layout: Layout,
    m: int,
    uneven_stages: bool,
    which: str,
    memo: dict[Any, Any],
) -> dict[str, int | float]:
    """:func:`predict_memory` of the ``which`` stage ("first" or "last") of a checked layout
    with ``m`` micro-batches (``memo``: :func:`worst_stage_memory`'s)."""
    t, p, b = layout.tp, layout.pp, layout.micro_batch
    if p not in memo:
        memo[p] = stage_layers(model, p, uneven_stages=uneven_stages)
    n_first, n_last = memo[p]
    n = n_first if which == "first" else n_last
    is_first, is_last = which == "first" or p == 1, which == "last" or p == 1
    key: tuple[Any, ...] = ("params", t, p, which)
    if key not in memo:
        memo[key] = _stage_params(model, layout, n, is_first, is_last)
    out = _model_state(layout, *memo[key])
    # one layer's activations depend on these, the layers in flight on p, v and m too
    key = ("activations", t, p, b, layout.cp, layout.cp_method, layout.sequence_parallel)
    key += (layout.recompute, layout.kernel, layout.virtual_stages, m, which)
    if key not in memo:
        memo[key] = _activation_bytes(model, layout, n, m, first=which == "first" or p == 1)
    out["activations"] = memo[key]
    out["logits"] = 4 * model.seq // layout.cp * b * model.vocab / t if is_last else 0
    out["buffers"] = _zero3_buffers(model, layout) if layout.zero == 3 else 0
    out["total"] = sum(out.values())
    return out


def _zero3_buffers(model: ModelSpec, layout: Layout) -> float:
    """Bytes of ZeRO-3's gathered bf16 weights: two layers (the one running, the one
    prefetched), each what one rank holds of it once gathered: the dense part over tp, the
    routed experts over the ranks they are split over (tp x ep, ``Layout.expert_split``): the
    gather runs among the ranks that share an expert shard, so no rank ever holds another's
    experts."""
    lp = model.layer_params()
    dense = lp["moe"] - lp["routed"] + model.kv_replicated(layout.tp)
    return 2 * 2 * (dense / layout.tp + lp["routed"] / layout.expert_split[0])


def _stage_params(
    model: ModelSpec, layout: Layout, layers: int, is_first: bool, is_last: bool
) -> tuple[int, int]:
    """(dense, routed-expert) parameters of a stage of ``layers`` layers: the dense part of each
    layer (all of a dense model's, with the K/V heads tp > kv_heads replicates:
    ``ModelSpec.kv_replicated``), the norms, the embedding on the first stage and the output
    layer on the last; the routed experts of its MoE layers apart (expert parallelism splits
    them)."""
    parts, lp = model.params(), model.layer_params()
    dense = layers * (lp["moe"] - lp["routed"] + model.kv_replicated(layout.tp)) + parts["other"]
    dense += parts["embedding"] if is_first else 0
    dense += (parts["output"] or (parts["embedding"] if layout.pp > 1 else 0)) if is_last else 0
    return dense, layers * lp["routed"]


def _model_state(layout: Layout, dense: int, routed: int) -> dict[str, int | float]:
    """:func:`_state` of ``layout``'s sizes (counted once per distinct set)."""
    split, share = layout.expert_split
    key = (layout.tp, layout.dp * layout.cp, split, share, layout.zero, layout.grad_bytes)
    return dict(_state(*key, dense, routed))


@functools.cache
def _state(
    t: int,
    group: int,
    split: int,
    share: int,
    zero: int,
    grad_bytes: int,
    dense: int,
    routed: int,
) -> dict[str, int | float]:
    """Weights, gradients and optimizer state per rank (``estimate.zero_state_breakdown_per_rank``:
    bf16 weights, ``grad_bytes`` gradients, fp32 master and Adam moments) of a stage's ``dense``
    parameters over ``t`` = tp, sharded by ZeRO ``zero`` over the ``group`` = dp x cp ranks that
    hold them, and of its ``routed`` experts split over ``split`` ranks and sharded over the
    ``share`` ranks that hold the same experts (``Layout.expert_split``: tp x ep and dp cp / ep,
    or folded ep x etp and tp cp dp / (ep etp); as ``estimate.moe_model_state_bytes_per_rank``
    groups them)."""
    kw: dict[str, Any] = dict(stage=zero, grad_bytes=grad_bytes)
    state = estimate.zero_state_breakdown_per_rank(-(-dense // t), world_size=group, **kw)
    out = {k: state[k] for k in ("params", "grads", "optimizer")}
    if routed:
        shard = -(-routed // split)
        experts = estimate.zero_state_breakdown_per_rank(shard, world_size=share, **kw)
        out = {k: out[k] + experts[k] for k in out}
    return out


def _layer_activations(
    model: ModelSpec, layout: Layout, recompute: Recompute, kernel: str = "eager"
) -> int | float:
    """One layer's activation bytes per rank under ``layout`` with ``recompute`` and the
    attention ``kernel`` (``estimate.activation_bytes_transformer_layer``; with cp > 1 ``estimate.
    cp_activation_bytes_per_layer``): the score matrix (its softmax and dropout) is kept only by
    the eager kernel with nothing recomputed; the flash kernel keeps what selective
    recomputation keeps. An MoE layer's MLP activations: each token through its top_k routed
    and the shared experts."""
    if kernel == "flash" and recompute == "none":
        recompute = "selective"  # no score matrix kept: Korthikanti's selective bytes
    mlp_width = (
        (model.top_k + model.shared_experts) * model.expert_ffn if model.experts else model.ffn
    )
    shape: dict[str, Any] = dict(
        kv_heads=model.kv_heads,
        ffn=mlp_width,
        gated_mlp=model.gated_mlp,
        dropout=model.dropout,
        tp=layout.tp,
        sequence_parallel=layout.sequence_parallel,
    )
    s, b, h, a = model.seq, layout.micro_batch, model.hidden, model.heads
    if layout.cp == 1 or recompute == "full":
        return estimate.activation_bytes_transformer_layer(
            s // layout.cp, b, h, a, recompute=recompute, **shape
        )
    return estimate.cp_activation_bytes_per_layer(
        s, b, h, a, cp=layout.cp, method=layout.cp_method, flash=recompute != "none", **shape
    )


def _activation_bytes(
    model: ModelSpec, layout: Layout, layers: int, microbatches: int, *, first: bool
) -> int | float:
    """Activation bytes a stage of ``layers`` keeps at its peak: one layer's bytes times the
    layers in flight (the first stage: ``pipeline_inflight_layers``; a later one runs each
    micro-batch's backward right after its forward), plus the layer rebuilt for its backward
    under full recomputation (both with the layout's attention kernel, ``Layout.kernel``)."""
    if first:
        inflight = estimate.pipeline_inflight_layers(
            layers, layout.pp, microbatches, layout.virtual_stages
        )
    else:
        inflight = layers
    one = _cached_layer(model, _activation_key(layout), layout.recompute, layout.kernel)
    activations = inflight * one
    # the layer being rebuilt for its backward, counted without a score matrix under either
    # kernel (an eager kernel's one layer of scores, 5 a s^2 b / tp bytes, is left out)
    if layout.recompute == "full":
        activations += _cached_layer(model, _activation_key(layout), "selective")
    return activations


def _activation_key(layout: Layout) -> Layout:
    """The layout with only what one layer's activations depend on (a cache key)."""
    key = (layout.tp, layout.micro_batch, layout.cp, layout.cp_method, layout.sequence_parallel)
    return _key_layout(*key)


@functools.cache
def _key_layout(tp: int, micro_batch: int, cp: int, cp_method: Any, sp: bool) -> Layout:
    return Layout(1, tp, micro_batch=micro_batch, cp=cp, cp_method=cp_method, sequence_parallel=sp)


_cached_layer = functools.cache(_layer_activations)
