"""Experts as they run: the expert-parallel all-to-alls of one MoE layer priced on the links
they cross, with node-limited routing and the imbalance a capacity factor allows, and what a
pipeline schedule hides of them (an explicit assumption: :data:`EP_SCHEDULES`). The router,
the token permutation and the grouped expert products are priced with the layer's other
products (``plan.gemm_time``). Introduced in notebooks/14_planning_a_run.ipynb.

Sources: DeepSeek-AI 2024, arXiv:2412.19437, Sec. 2.1.2 and 3.2.2 (node-limited routing: each
token to experts on at most M = 4 nodes, sent once per node over InfiniBand and forwarded over
NVLink; DualPipe overlaps one micro-batch's all-to-alls with another's compute); Fedus, Zoph,
Shazeer 2021, arXiv:2101.03961, Sec. 2.2 (capacity factor); Megatron-Core's MoE overlap of the
expert-parallel all-to-all with the 1F1B schedule's other micro-batch (its
``--overlap-moe-expert-parallel-comm``, recalled).
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

from course_lib.measure import estimate
from course_lib.plan.comm_model import span
from course_lib.plan.specs import ClusterSpec, Layout, ModelSpec, attention_fields

__all__ = ["EP_SCHEDULES", "AllToAll", "all_to_all", "exposed_all_to_all", "ep_exposed_s"]

#: what a schedule hides of a layer's all-to-alls, and behind what: "none" hides nothing;
#: "1F1B-overlapped" (Megatron-Core) hides them behind the attention of the other
#: micro-batch that 1F1B runs at the same time; "DualPipe" (DeepSeek-V3) behind the whole layer
#: of the paired forward and backward chunks. In each, what the compute does not cover stays
#: exposed: exposed = max(0, all-to-all - compute that hides it).
EP_SCHEDULES = {
    "none": "every all-to-all on the critical path (a plain MoE layer waits for its tokens)",
    "1F1B-overlapped": "hidden behind the attention products of the micro-batch 1F1B runs "
    "beside it (Megatron-Core's EP overlap); what exceeds them is exposed",
    "DualPipe": "hidden behind the whole layer of the paired forward and backward chunks "
    "(DeepSeek-V3, arXiv:2412.19437 Sec. 3.2.1); what exceeds it is exposed",
}


class AllToAll(NamedTuple):
    """Seconds of one MoE layer's dispatch and combine, forward and backward, on one rank:
    ``nvlink`` and ``network`` (the bytes each link carries, side by side: the slower sets
    ``total``, with the latency), and ``network_bytes`` per token over the network."""

    nvlink: float
    network: float
    latency: float
    total: float
    network_bytes: float


def _node_copies(top_k: int, nodes: int, node_limit: int) -> float:
    """Copies of a token that leave its node: top_k (nodes - 1) / nodes when each copy travels
    on its own; with node-limited routing (at most ``node_limit`` nodes, one copy per node,
    forwarded inside it over NVLink) the expected remote nodes among those reached, min(M,
    distinct nodes of top_k uniform picks) (nodes - 1) / nodes."""
    remote = (nodes - 1) / nodes
    if not node_limit:
        return top_k * remote
    distinct = nodes * (1 - (1 - 1 / nodes) ** top_k)
    return min(node_limit, distinct) * remote


@functools.cache
def all_to_all(
    model: ModelSpec,
    cluster: ClusterSpec,
    layout: Layout,
    *,
    node_limit: int = 0,
    capacity_factor: float = 1.0,
) -> AllToAll:
    """:class:`AllToAll` of one MoE layer for a rank's micro-batch of tokens (micro_batch x seq
    / (cp tp)), bf16 rows of h, each moving ``estimate.ep_all_to_all_bytes_per_assignment``
    when it leaves its rank. Each token's top_k copies go to experts spread evenly over ep
    ranks, (per_node - 1) / (ep - 1) of the others in its node (NVLink), the rest across nodes
    (network): there, ``node_limit`` (DeepSeek-V3's M = 4) sends one copy per node. Dispatch and
    combine, forward and backward: 4 transfers. The busiest rank receives ``capacity_factor``
    times the mean (1: perfect balance; a capacity factor bounds what routing may send it)."""
    e = layout.ep
    if e == 1 or not model.experts:
        return AllToAll(0.0, 0.0, 0.0, 0.0, 0.0)
    tokens = layout.micro_batch * model.seq // (layout.cp * layout.tp)
    row = estimate.ep_all_to_all_bytes_per_assignment(model.hidden)  # a copy: 4 x 2h
    nodes = span(cluster, layout.dims.stride("ep"), e)[0]
    k = model.top_k
    near_copies, far_copies = k * (e - 1) / e, 0.0  # copies to other ranks: all in the node
    if nodes > 1:
        every_remote = k * (nodes - 1) / nodes
        far_copies = _node_copies(k, nodes, node_limit)
        # to ranks of the own node, and (node-limited) forwarded inside the node they reach
        near_copies = k * (e - 1) / e - every_remote + (every_remote - far_copies)
    nv = capacity_factor * tokens * near_copies * row / (cluster.intra_GBps * 1e9)
    net_bytes = far_copies * row
    net = capacity_factor * tokens * net_bytes / (cluster.inter_GBps * 1e9)
    alpha = cluster.alpha_inter_s if nodes > 1 else cluster.alpha_intra_s
    return AllToAll(nv, net, 4 * alpha, max(nv, net) + 4 * alpha, net_bytes)


def exposed_all_to_all(total: float, schedule: str, attention_s: float, layer_s: float) -> float:
    """What ``schedule`` (:data:`EP_SCHEDULES`) leaves exposed of a layer's all-to-all seconds
    ``total``: all of it ("none"), what exceeds the other micro-batch's attention
    (``attention_s``, "1F1B-overlapped") or its whole layer (``layer_s``, "DualPipe")."""
    hide = {"none": 0.0, "1F1B-overlapped": attention_s, "DualPipe": layer_s}[schedule]
    return max(0.0, total - hide)


@functools.cache
def _attention_share(model: ModelSpec) -> float:
    """The attention's share of an MoE layer's training FLOPs per token: (6 P_attention + 12 s
    w) / (6 P_active + 12 s w), w = ``attention_width``."""
    core = 12 * model.seq * model.attention_width
    attention = estimate.attention_param_count(**attention_fields(model))["total"]
    return (6 * attention + core) / (6 * model.layer_params()["moe_active"] + core)


def ep_exposed_s(
    model: ModelSpec,
    cluster: ClusterSpec,
    layout: Layout,
    layers: int,
    how: Any,
    layer_s: float,
) -> tuple[float, float]:
    """(exposed, total) seconds of one micro-batch's all-to-alls on a stage of ``layers`` MoE
    layers under ``how`` (``Assumptions``: ``ep_schedule``, ``ep_node_limit``,
    ``capacity_factor``, and ``ep_overlap``, a further fraction hidden on top of the
    schedule's), ``layer_s`` the compute of one layer's forward and backward on the rank."""
    a2a = all_to_all(
        model, cluster, layout, node_limit=how.ep_node_limit, capacity_factor=how.capacity_factor
    )
    if not a2a.total:
        return 0.0, 0.0
    attention_s = layer_s * _attention_share(model)
    exposed = exposed_all_to_all(a2a.total, how.ep_schedule, attention_s, layer_s)
    return (1 - how.ep_overlap) * layers * exposed, layers * a2a.total
