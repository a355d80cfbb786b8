"""When each parallelism of a layout hides its communication: the thresholds of
``estimate.overlap`` evaluated at a layout's sizes, on the link each group crosses.

One row per parallelism the layout uses: what it has (tokens per GPU, hidden size, micro-batches,
transfer over compute, tokens per expert) beside the value at which its communication takes no
longer than the compute it can run beside. :func:`explain` uses it to say why a layout is
communication-bound; notebooks/14_planning_a_run.ipynb prints the table for real runs.

Achieved FLOP/s are the cluster's dense bf16 peak times the assumed matmul efficiency
(:class:`Assumptions`); a link is NVLink inside a node and the network across (one port per
GPU, per direction). A data-parallel group with g of its ranks in each node all-reduces in two
levels, the network part carrying 1/g of the gradient on each of g ports: g ports' bandwidth.
The thresholds ignore what the step-time model adds (latency per layer, partial overlap), so
a row can hide by its threshold and still cost a little in ``plan``'s columns.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from course_lib import validate as _v
from course_lib.measure import estimate
from course_lib.plan.comm_model import DEFAULT_ASSUMPTIONS, Assumptions, span
from course_lib.plan.memory import microbatches
from course_lib.plan.specs import ClusterSpec, Layout, ModelSpec

__all__ = ["BUBBLE_TARGET", "layout_thresholds", "threshold_clause"]

#: the bubble the pipeline row asks for (a fraction of the step)
BUBBLE_TARGET = 0.05


def _link(
    cluster: ClusterSpec, stride: int, size: int, *, ports: bool = False
) -> tuple[str, float, float]:
    """(name, GB/s per direction, alpha) of the slowest hop of a group; ``ports``: the
    group's ranks in one node use their own ports side by side (two-level all-reduce)."""
    nodes, per_node = span(cluster, stride, size)
    if nodes > 1:
        g = per_node if ports else 1
        name = "network" + (f" ({g} ports)" if g > 1 else "")
        return name, cluster.inter_GBps * g, cluster.alpha_inter_s
    return "NVLink", cluster.intra_GBps, cluster.alpha_intra_s


def _row(
    parallelism: str, link: str, quantity: str, has: float, needs: float, hides: bool
) -> dict[str, Any]:
    return dict(
        parallelism=parallelism, link=link, quantity=quantity, has=has, needs=needs, hides=hides
    )


def _pp_rows(
    model: ModelSpec, cluster: ClusterSpec, layout: Layout, tokens: int, kw: dict[str, Any]
) -> list[dict[str, Any]]:
    """The pipeline's two rows: its micro-batches against the bubble target, and one
    activation's send (network when the stages sit in different nodes) over a stage's compute."""
    m = microbatches(model, layout, tokens)
    need = estimate.pp_bubble_micro_batches(
        layout.pp, BUBBLE_TARGET, virtual_stages=layout.virtual_stages
    )
    inner = layout.tp * layout.cp * layout.dp
    link, gbps = ("network", cluster.inter_GBps) if inner >= cluster.gpus_per_node else (
        "NVLink", cluster.intra_GBps)  # fmt: skip
    ratio = estimate.pp_transfer_to_compute(
        hidden=model.hidden, layers=max(1, model.layers // layout.pp), link_GBps=gbps, **kw
    )
    return [
        _row("PP", "-", "micro-batches", m, need, m >= need),
        _row("PP", link, "transfer / compute", ratio, 1.0, ratio <= 1),
    ]


def layout_thresholds(
    model: ModelSpec,
    cluster: ClusterSpec,
    layout: Layout,
    *,
    global_batch_tokens: int,
    assumptions: Assumptions = DEFAULT_ASSUMPTIONS,
) -> pd.DataFrame:
    """The thresholds of ``layout``: one row per parallelism it uses (degree > 1), columns
    ``parallelism``, ``link``, ``quantity`` (what is compared), ``has`` (the layout's value),
    ``needs`` (the threshold: at least this, except "transfer / compute": at most), ``hides``.

    * DP (ZeRO 0-2) / FSDP (ZeRO-3): one micro-batch's tokens on a rank, s b / cp, against
      ``estimate.dp_overlap_min_tokens`` / ``fsdp_overlap_min_tokens`` over the dp x cp group;
    * TP: the hidden size against ``estimate.tp_overlap_min_hidden`` (with the micro-batch's
      tokens and the link's latency);
    * PP: micro-batches against ``estimate.pp_bubble_micro_batches`` (bubble below
      :data:`BUBBLE_TARGET`), and ``estimate.pp_transfer_to_compute`` against 1;
    * CP: tokens per rank, s / cp, against ``estimate.cp_ring_overlap_min_tokens`` (causal,
      zig-zag; the K/V widths of the model at its tp);
    * EP: tokens per expert, ep T k / E with T = s b / (cp tp), against ``estimate.
      ep_overlap_min_tokens_per_expert`` (may be inf: never hides)."""
    mfu = assumptions.matmul_efficiency
    kw: dict[str, Any] = dict(peak_flops=cluster.peak_flops, mfu=mfu)
    tokens = layout.micro_batch * model.seq // layout.cp
    rows: list[dict[str, Any]] = []
    group = layout.dp * layout.cp
    if group > 1:
        link, gbps, _ = _link(cluster, layout.tp, group, ports=True)
        fn = (
            estimate.fsdp_overlap_min_tokens if layout.zero == 3 else estimate.dp_overlap_min_tokens
        )
        extra = {} if layout.zero == 3 else {"grad_bytes": layout.grad_bytes}
        need = fn(world_size=group, link_GBps=gbps, **extra, **kw)
        name = "FSDP" if layout.zero == 3 else "DP"
        rows.append(_row(name, link, "tokens per GPU", tokens, need, tokens >= need))
    if layout.tp > 1:
        link, gbps, alpha = _link(cluster, 1, layout.tp)
        need = estimate.tp_overlap_min_hidden(
            tp=layout.tp, link_GBps=gbps, tokens=tokens, alpha_s=alpha, **kw
        )
        rows.append(_row("TP", link, "hidden size", model.hidden, need, model.hidden >= need))
    if layout.pp > 1:
        rows += _pp_rows(model, cluster, layout, global_batch_tokens, kw)
    if layout.cp > 1:
        link, gbps, _ = _link(cluster, layout.tp, layout.cp)
        n = model.seq // layout.cp
        need = estimate.cp_ring_overlap_min_tokens(
            heads=model.heads, kv_heads=model.kv_heads, tp=layout.tp, causal=True,
            link_GBps=gbps, **kw)  # fmt: skip
        rows.append(_row("CP", link, "tokens per rank", n, need, n >= need))
    if layout.ep > 1 and model.experts:
        link, gbps, alpha = _link(cluster, layout.tp * layout.cp, layout.ep)
        c = layout.ep * (tokens / layout.tp) * model.top_k / model.experts
        need = estimate.ep_overlap_min_tokens_per_expert(
            hidden=model.hidden, ffn=model.expert_ffn, experts=model.experts, ep=layout.ep,
            alpha_s=alpha, gated_mlp=model.gated_mlp, link_GBps=gbps, **kw)  # fmt: skip
        rows.append(_row("EP", link, "tokens per expert", c, need, c >= need))
    return pd.DataFrame(rows, columns=["parallelism", "link", "quantity", "has", "needs", "hides"])


def _num(x: float) -> str:
    return f"{x:,.0f}" if x >= 10 else f"{x:.2g}"


def threshold_clause(row: Any) -> str:
    """One row of :func:`layout_thresholds` as words, e.g. "TP on network: hidden size 4,096,
    below the 27,692 at which it would fit behind its compute: communication-bound"."""
    if not all(key in row for key in ("parallelism", "link", "quantity", "has", "needs", "hides")):
        raise ValueError(f"row = {_v.describe(row)}: expected a row of layout_thresholds")
    if row["quantity"] == "micro-batches":
        side = "at least" if row["hides"] else "fewer than"
        return (
            f"PP: {_num(row['has'])} micro-batches, {side} the {_num(row['needs'])} a bubble "
            f"below {BUBBLE_TARGET:.0%} needs"
        )
    over = row["quantity"] == "transfer / compute"
    head = f"{row['parallelism']} on {row['link']}: {row['quantity']} {_num(row['has'])}, "
    if row["hides"]:
        side = "at most" if over else "at least"
        return head + f"{side} the {_num(row['needs'])} at which it fits behind its compute"
    if row["needs"] == float("inf"):
        return head + "at no size does it fit behind its compute: communication-bound"
    side = "above" if over else "below"
    return (
        head + f"{side} the {_num(row['needs'])} at which it would fit behind its compute: "
        "communication-bound"
    )
