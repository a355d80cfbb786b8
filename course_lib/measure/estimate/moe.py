"""Mixture of experts: parameters total and active, expert capacity, the bytes expert
parallelism's all-to-all sends, model-state memory per GPU under EP x ZeRO.

Introduced in notebooks/16_mixture_of_experts.ipynb. Sources: Fedus, Zoph, Shazeer 2021,
"Switch Transformers" (arXiv:2101.03961: top-1, capacity factor, Eq. 4's balancing loss);
Lepikhin et al. 2020, "GShard" (arXiv:2006.16668: top-2, expert capacity); Jiang et al. 2024,
"Mixtral of Experts" (arXiv:2401.04088); DeepSeek-AI 2024, "DeepSeek-V3 Technical Report"
(arXiv:2412.19437).
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

from course_lib import validate as _v
from course_lib.measure.estimate.units import exact
from course_lib.measure.estimate.zero import zero_bytes_per_rank

__all__ = [
    "moe_param_count",
    "moe_capacity",
    "ep_all_to_all_bytes",
    "ep_all_to_all_bytes_per_assignment",
    "ep_all_to_all_bytes_per_token",
    "moe_model_state_bytes_per_rank",
]


def moe_param_count(
    hidden: int,
    ffn: int,
    experts: int,
    *,
    top_k: int,
    shared_experts: int = 0,
    gated_mlp: bool = False,
    bias: bool = False,
    layers: int = 1,
) -> dict[str, int]:
    """Parameters of ``layers`` MoE blocks (router + experts; no attention, no norms).

    One expert: 2 h f (+ f + h with ``bias``) or, ``gated_mlp`` (SwiGLU), 3 h f; the router
    h E. ``total`` = layers (h E + (E + shared) expert); ``active`` (what one token uses) =
    layers (h E + (top_k + shared) expert). Returns ``{"expert", "router", "total", "active"}``
    (per layer for expert and router)."""
    h, f = _v.count("hidden", hidden, minimum=1), _v.count("ffn", ffn, minimum=1)
    e = _v.count("experts", experts, minimum=1)
    k = _v.count("top_k", top_k, minimum=1, maximum=e)
    s = _v.count("shared_experts", shared_experts, minimum=0)
    n = _v.count("layers", layers, minimum=1)
    one = 3 * h * f if gated_mlp else 2 * h * f + ((f + h) if bias else 0)
    router = h * e
    return {
        "expert": one,
        "router": router,
        "total": n * (router + (e + s) * one),
        "active": n * (router + (k + s) * one),
    }


def moe_capacity(tokens: int, experts: int, *, top_k: int = 1, capacity_factor: float) -> int:
    """Assignments one expert takes (Switch Transformer, Sec. 2.2): ceil(capacity_factor x
    tokens x top_k / experts), tokens being those of one routing group (one rank's batch)."""
    t = _v.count("tokens", tokens, minimum=1)
    e = _v.count("experts", experts, minimum=1)
    k = _v.count("top_k", top_k, minimum=1, maximum=e)
    cf = _v.number("capacity_factor", capacity_factor, positive=True)
    return math.ceil(Fraction(cf).limit_denominator(10**6) * t * k / e)


def _routed(routed: Any) -> list[list[int]]:
    if isinstance(routed, (str, bytes)) or not hasattr(routed, "__iter__"):
        raise TypeError(
            f"routed = {_v.describe(routed)}: expected a ranks x experts table of counts, "
            "e.g. [[3, 1], [0, 4]]"
        )
    rows = [[_v.count("routed", n, minimum=0) for n in row] for row in routed]
    if not rows or any(len(r) != len(rows[0]) for r in rows) or len(rows[0]) % len(rows):
        raise ValueError(
            f"routed = {_v.describe(routed)}: expected one row per rank, each with the same "
            f"number of experts, a multiple of the ranks ({len(rows)})"
        )
    return rows


def ep_all_to_all_bytes(
    routed: Any, hidden: int, *, rank: int, dtype_bytes: int = 2, count_bytes: int = 8
) -> dict[str, int]:
    """Bytes ``rank`` sends for one MoE layer under expert parallelism, exactly, from the
    routing: ``routed[src][e]`` = assignments rank src sends to expert e (after capacity drops);
    W = len(routed) ranks, E = len(routed[0]) experts, rank r holding experts r E/W ..
    (r+1) E/W - 1.

    * ``counts``: the count exchange, (W-1) E/W x ``count_bytes`` (int64);
    * ``dispatch``: rows this rank sends to experts on other ranks x hidden x dtype_bytes;
    * ``combine``: rows other ranks sent to this rank's experts, sent back (same width);
    * ``sent_forward`` = counts + dispatch + combine; ``sent_backward`` = dispatch + combine
      (each all-to-all's backward is the exchange reversed; counts need no gradient);
      ``sent`` = both. Rows a rank keeps for its own experts never touch the wire."""
    table = _routed(routed)
    w, e = len(table), len(table[0])
    r = _v.count("rank", rank, minimum=0, maximum=w - 1)
    h = _v.count("hidden", hidden, minimum=1)
    p = _v.count("dtype_bytes", dtype_bytes, minimum=1)
    c = _v.count("count_bytes", count_bytes, minimum=1)
    local = e // w
    mine = range(r * local, (r + 1) * local)
    out_rows = sum(n for i, n in enumerate(table[r]) if i not in mine)
    in_rows = sum(table[s][i] for s in range(w) if s != r for i in mine)
    counts = (w - 1) * local * c
    dispatch, combine = out_rows * h * p, in_rows * h * p
    return {
        "counts": counts,
        "dispatch": dispatch,
        "combine": combine,
        "sent_forward": counts + dispatch + combine,
        "sent_backward": dispatch + combine,
        "sent": counts + 2 * (dispatch + combine),
    }


def ep_all_to_all_bytes_per_assignment(
    hidden: int, *, dtype_bytes: int = 2, backward: bool = True
) -> int:
    """Bytes one assignment (a token's row for one expert) moves over one MoE layer when its
    expert sits on another rank: the row out (dispatch) and its result back (combine), hidden x
    dtype_bytes each, and both again in backward: 4 hidden dtype_bytes (2 hidden dtype_bytes
    with ``backward=False``). 32 KiB for a bf16 row of 4,096. The one count of what an
    all-to-all moves per row: :func:`ep_all_to_all_bytes_per_token` (uniform routing),
    ``overlap.ep_overlap_min_tokens_per_expert`` and the planner's ``plan.moe_time`` use it."""
    h = _v.count("hidden", hidden, minimum=1)
    p = _v.count("dtype_bytes", dtype_bytes, minimum=1)
    passes = 2 if _v.choice("backward", backward, (True, False)) else 1
    return 2 * passes * h * p


def ep_all_to_all_bytes_per_token(
    hidden: int, *, ep: int, top_k: int, dtype_bytes: int = 2
) -> int | float:
    """Bytes one rank sends per token of its own and MoE layer, forward and backward, under
    uniform routing: each of the token's top_k assignments leaves the rank with probability
    (ep-1)/ep and moves :func:`ep_all_to_all_bytes_per_assignment` (dispatch and combine,
    forward and backward): 4 top_k (ep-1)/ep hidden dtype_bytes. The count exchange is left
    out (per layer, not per token). Balanced routing is the best case; a hot expert's rank
    receives more."""
    row = ep_all_to_all_bytes_per_assignment(hidden, dtype_bytes=dtype_bytes)
    n = _v.count("ep", ep, minimum=1)
    k = _v.count("top_k", top_k, minimum=1)
    return exact(Fraction(k * (n - 1) * row, n))


def moe_model_state_bytes_per_rank(
    dense_params: int,
    expert_params: int,
    *,
    ep: int,
    world_size: int,
    stage: int = 1,
    stages: int = 1,
    k: int = 12,
    param_bytes: int = 2,
    grad_bytes: int = 2,
) -> dict[str, int | float]:
    """Model-state bytes per GPU (weights, gradients, optimizer state: ``param_bytes`` +
    ``grad_bytes`` + ``k`` per parameter) with ``world_size`` GPUs, ``stages`` pipeline stages
    (each holding 1/stages of every kind of parameter), the experts split over ``ep`` ranks and
    ZeRO ``stage`` sharding over the data-parallel ranks of each kind:

    * dense (attention, embeddings, router, shared experts): replicated over
      dp = world_size / stages ranks, ZeRO over dp;
    * routed experts: 1/ep of them per rank, replicated over world_size / (stages ep) ranks
      (the expert-data-parallel group), ZeRO over that group.

    Returns ``{"dense", "experts", "total"}`` (bytes) with the group sizes
    ``{"dp", "expert_dp"}``."""
    d = _v.count("dense_params", dense_params, minimum=0)
    x = _v.count("expert_params", expert_params, minimum=0)
    e, n = _v.count("ep", ep, minimum=1), _v.count("world_size", world_size, minimum=1)
    pp = _v.count("stages", stages, minimum=1)
    if n % (pp * e):
        raise ValueError(f"world_size = {n}: expected a multiple of stages x ep = {pp * e}")
    dp, edp = n // pp, n // (pp * e)
    kw: dict[str, Any] = dict(stage=stage, k=k, param_bytes=param_bytes, grad_bytes=grad_bytes)
    dense = Fraction(zero_bytes_per_rank(d, world_size=dp, **kw)) / pp
    experts = Fraction(zero_bytes_per_rank(x, world_size=edp, **kw)) / (pp * e)
    return {
        "dense": exact(dense),
        "experts": exact(experts),
        "total": exact(dense + experts),
        "dp": dp,
        "expert_dp": edp,
    }
