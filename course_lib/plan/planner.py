"""The planner: every dp x tp x pp layout (x ZeRO stage, recomputation, micro-batch, interleaving)
of a model on a cluster, its memory per GPU and its step time, ranked; and why the winner wins.

Step time of one layout, per micro-batch on the slowest pipeline stage (the one with the most
layers, plus the output layer on the last stage):

* compute: its model FLOPs (``estimate.training_flops_per_token``: 6 P + 12 s h per layer per
  token, 6 V h for the output layer) / tp, at ``efficiency`` x the GPU's peak -- the fraction
  of peak large bf16 matrix products sustain (an assumption, stated in every result);
* recompute: the FLOPs recomputation adds, at the same rate;
* TP: 4 all-reduces of s b h bf16 values per layer (6 with full recomputation;
  ``estimate.tp_payload_bytes_per_layer``), ring time on NVLink when tp fits in a node, else the
  two-level time over the network (``estimate.allreduce_time``,
  ``estimate.hierarchical_allreduce_time``), none of it hidden;
* P2P: the stage-boundary activation each way, v times with interleaving;

then the pipeline: (m + (p-1)/v) micro-batch times (the bubble is ``estimate.
pipeline_bubble_fraction`` of the total), plus the data-parallel gradient traffic backward does
not hide: ZeRO 0/1 reduce once per step, overlapped with the last micro-batch's backward
(``estimate.ddp_exposed_comm_time``); ZeRO-2 reduce-scatters after every micro-batch; ZeRO-3
also gathers the weights twice per micro-batch (each overlapped with that micro-batch's
compute). MFU = model FLOPs (6 N + 12 L h s per token) / (step time x GPUs x peak).
Introduced in notebooks/14_planning_a_run.ipynb.
"""

from __future__ import annotations

import math

from course_lib import validate as _v
from course_lib.measure import estimate
from course_lib.plan.memory import (
    MEMORY_CATEGORIES,
    check_layout,
    microbatches,
    predict_memory,
    stage_layers,
)
from course_lib.plan.specs import RECOMPUTE, ClusterSpec, Layout, ModelSpec, divisors

__all__ = [
    "DEFAULT_EFFICIENCY",
    "DEFAULT_RESERVE",
    "step_time",
    "plan",
    "explain",
    "evaluate",
    "TIME_PARTS",
]

#: fraction of the GPU's peak that large bf16 matrix products sustain in training (assumed)
DEFAULT_EFFICIENCY = 0.6
#: fraction of each GPU's memory left for the CUDA context, NCCL buffers and fragmentation
DEFAULT_RESERVE = 0.05
#: the parts of a step, in seconds, as :func:`step_time` returns them
TIME_PARTS = ("compute_s", "recompute_s", "tp_comm_s", "p2p_s", "bubble_s", "dp_comm_s")


def _dp_group(cluster: ClusterSpec, layout: Layout) -> tuple[int, int]:
    """(nodes, GPUs per node) of one data-parallel group: ranks are ordered pp, dp, tp (tp
    innermost, as in ``parallel.mesh``), so dp peers sit tp ranks apart."""
    g = cluster.gpus_per_node
    per_node = max(1, min(layout.dp, g // layout.tp)) if layout.tp < g else 1
    return math.ceil(layout.dp / per_node), per_node


def _allreduce_s(
    size: float, ranks: int, cluster: ClusterSpec, *, nodes: int, per_node: int
) -> float:
    if ranks <= 1 or size == 0:
        return 0.0
    return estimate.hierarchical_allreduce_time(
        size,
        nodes=nodes,
        gpus_per_node=per_node,
        intra_GBps=cluster.intra_GBps,
        inter_GBps=cluster.inter_GBps,
    )


def step_time(
    model: ModelSpec,
    cluster: ClusterSpec,
    layout: Layout,
    *,
    global_batch_tokens: int,
    efficiency: float = DEFAULT_EFFICIENCY,
    uneven_stages: bool = False,
) -> dict[str, float]:
    """Seconds of one training step under ``layout``, by part (:data:`TIME_PARTS`), with
    ``step_s``, ``microbatches``, ``bubble_fraction``, ``mfu``, ``tokens_per_s``. See the module
    docstring for the model; every term comes from ``estimate``."""
    check_layout(
        model, layout, cluster, global_batch_tokens=global_batch_tokens, uneven_stages=uneven_stages
    )
    eff = _v.number("efficiency", efficiency, positive=True, maximum=1)
    t, p, v, b, s, h = (
        layout.tp,
        layout.pp,
        layout.virtual_stages,
        layout.micro_batch,
        model.seq_len,
        model.hidden,
    )
    m = microbatches(model, layout, global_batch_tokens)
    n, n_last = stage_layers(model, p, uneven_stages=uneven_stages)
    parts = model.params()
    rate = eff * cluster.peak_flops
    tokens = b * s

    def stage_flops(layers, output):
        per_layer = parts["per_layer"]
        flops = estimate.training_flops_per_token(
            layers * per_layer, layers=layers, hidden=h, seq=s
        )
        extra = estimate.recompute_flops_per_token(
            per_layer, layers=layers, hidden=h, seq=s, recompute=layout.recompute
        )
        return flops + (6 * model.vocab * h if output else 0), extra

    # the slowest stage sets the pace: a middle one, or the last with the output layer
    slow = max(stage_flops(n, p == 1), stage_flops(n_last, True), key=sum)
    compute = slow[0] * tokens / t / rate
    recompute = slow[1] * tokens / t / rate
    tp_comm = 0.0
    if t > 1:
        calls = estimate.tp_payload_bytes_per_layer(s, b, h, recompute=layout.recompute) // (
            2 * s * b * h
        )
        payload = 2 * s * b * h
        if t <= cluster.gpus_per_node:
            one = estimate.allreduce_time(payload, t, bandwidth=cluster.intra_GBps * 1e9)
        else:
            one = _allreduce_s(
                payload,
                t,
                cluster,
                nodes=t // cluster.gpus_per_node,
                per_node=cluster.gpus_per_node,
            )
        tp_comm = n * calls * one
    p2p = 0.0
    if p > 1:
        across = layout.tp * layout.dp >= cluster.gpus_per_node
        bw = (cluster.inter_GBps if across else cluster.intra_GBps) * 1e9
        boundary = estimate.pipeline_boundary_bytes(b, s, h) / (
            t if layout.sequence_parallel else 1
        )
        p2p = 2 * v * boundary / bw
    per_mb = compute + recompute + tp_comm + p2p
    bubble_fraction = estimate.pipeline_bubble_fraction(p, m, v)
    pipeline = m * per_mb / (1 - bubble_fraction)
    bubble = pipeline - m * per_mb
    # data-parallel gradients of the fullest stage's parameters on this rank (bf16)
    stage_params = max(
        n * parts["per_layer"] + parts["embedding"],
        n_last * parts["per_layer"] + (parts["output"] or parts["embedding"]),
    )
    grad_bytes = 2 * -(-stage_params // t)
    nodes, per_node = _dp_group(cluster, layout)
    allreduce = _allreduce_s(grad_bytes, layout.dp, cluster, nodes=nodes, per_node=per_node)
    backward = 2 / 3 * (compute + recompute)  # backward of one micro-batch
    if layout.dp == 1:
        dp_comm = 0.0
    elif layout.zero <= 1:
        dp_comm = estimate.ddp_exposed_comm_time(
            -(-grad_bytes // 32),
            grad_bytes=grad_bytes,
            backward_s=backward,
            alpha=0.0,
            beta=allreduce / grad_bytes,
        )
    elif layout.zero == 2:
        dp_comm = m * max(0.0, allreduce / 2 - backward)
    else:  # gather weights for forward and backward, reduce-scatter gradients, every micro-batch
        dp_comm = m * max(0.0, 1.5 * allreduce - (compute + recompute))
    step = pipeline + dp_comm
    model_flops = (
        estimate.training_flops_per_token(model.n_params, layers=model.layers, hidden=h, seq=s)
        * global_batch_tokens
    )
    out = {
        "compute_s": m * compute,
        "recompute_s": m * recompute,
        "tp_comm_s": m * tp_comm,
        "p2p_s": m * p2p,
        "bubble_s": bubble,
        "dp_comm_s": dp_comm,
        "step_s": step,
        "microbatches": m,
        "bubble_fraction": bubble_fraction,
        "mfu": model_flops / (step * layout.gpus * cluster.peak_flops),
        "tokens_per_s": global_batch_tokens / step,
    }
    return out


def evaluate(
    model: ModelSpec,
    cluster: ClusterSpec,
    layout: Layout,
    *,
    global_batch_tokens: int,
    total_tokens: float | None = None,
    efficiency: float = DEFAULT_EFFICIENCY,
    reserve: float = DEFAULT_RESERVE,
    uneven_stages: bool = False,
) -> dict:
    """One row of :func:`plan` for one layout: the layout, memory by category (GB), whether it
    fits in (1 - reserve) of the GPU's memory, and the step time by part."""
    mem = predict_memory(
        model, layout, global_batch_tokens=global_batch_tokens, uneven_stages=uneven_stages
    )
    usable = (1 - _v.number("reserve", reserve, minimum=0, maximum=0.9)) * cluster.memory_bytes
    row = {
        "dp": layout.dp,
        "tp": layout.tp,
        "pp": layout.pp,
        "zero": layout.zero,
        "recompute": layout.recompute,
        "micro_batch": layout.micro_batch,
        "v": layout.virtual_stages,
        "memory_GB": mem["total"] / 1e9,
        **{f"{k}_GB": mem[k] / 1e9 for k in MEMORY_CATEGORIES},
        "fits": mem["total"] <= usable,
    }
    row.update(
        step_time(
            model,
            cluster,
            layout,
            global_batch_tokens=global_batch_tokens,
            efficiency=efficiency,
            uneven_stages=uneven_stages,
        )
    )
    if total_tokens is not None:
        row["days"] = (
            _v.number("total_tokens", total_tokens, positive=True) / row["tokens_per_s"] / 86400
        )
    return row


def _candidates(model, cluster, gpus, seqs, uneven_stages, max_micro_batch):
    g = math.gcd(model.heads, model.kv_heads)
    pps = range(1, model.layers + 1) if uneven_stages else divisors(model.layers)
    for tp in divisors(g):
        for pp in pps:
            if gpus % (tp * pp):
                continue
            dp = gpus // (tp * pp)
            if seqs % dp:
                continue
            n = stage_layers(model, pp, uneven_stages=uneven_stages)[0]
            for mb in [d for d in divisors(seqs // dp) if d <= max_micro_batch]:
                m = seqs // (dp * mb)
                vs = (
                    [1]
                    if pp == 1
                    else [v for v in (1, 2, 4, 8) if n % v == 0 and (v == 1 or m >= pp)]
                )
                for v in vs:
                    for zero in (0, 1, 2, 3):
                        for rec in RECOMPUTE:
                            yield Layout(dp, tp, pp, zero, rec, mb, v)


def plan(
    model: ModelSpec,
    cluster: ClusterSpec,
    *,
    global_batch_tokens: int,
    total_tokens: float | None = None,
    gpus: int | None = None,
    efficiency: float = DEFAULT_EFFICIENCY,
    reserve: float = DEFAULT_RESERVE,
    uneven_stages: bool = False,
    max_micro_batch: int = 8,
):
    """Every layout of ``model`` on ``gpus`` GPUs of ``cluster`` (all of them by default) that
    fits, ranked by step time: a pandas DataFrame, one row per layout (``rank`` 1 = fastest),
    with memory per GPU by category (GB), the step time by part (s), MFU, tokens/s and, with
    ``total_tokens``, days. Layouts that do not fit are in ``result.attrs["rejected"]``; the
    inputs in ``result.attrs["inputs"]`` (what :func:`explain` reads).

    Enumerated: tp dividing the heads and the KV heads; pp dividing the layers (any pp with
    ``uneven_stages``); dp = gpus / (tp pp) dividing the global batch in sequences; micro-batch
    sizes up to ``max_micro_batch`` that divide each replica's share; ZeRO 0-3; recomputation
    none / selective / full; interleaving v in 1, 2, 4, 8 when the stage's layers split evenly
    and there are at least pp micro-batches.
    """
    import pandas as pd

    if not isinstance(model, ModelSpec):
        raise TypeError(f"model = {model!r}: expected a ModelSpec (e.g. plan.model('Llama-2-7B'))")
    if not isinstance(cluster, ClusterSpec):
        raise TypeError(f"cluster = {cluster!r}: expected a ClusterSpec (e.g. plan.cluster(...))")
    n_gpus = (
        cluster.gpus if gpus is None else _v.count("gpus", gpus, minimum=1, maximum=cluster.gpus)
    )
    tokens = _v.count("global_batch_tokens", global_batch_tokens, minimum=1)
    if tokens % model.seq_len:
        raise ValueError(
            f"global_batch_tokens = {tokens}: expected a multiple of seq_len = "
            f"{model.seq_len} (whole sequences)"
        )
    seqs = tokens // model.seq_len
    rows = [
        evaluate(
            model,
            cluster,
            lay,
            global_batch_tokens=tokens,
            total_tokens=total_tokens,
            efficiency=efficiency,
            reserve=reserve,
            uneven_stages=uneven_stages,
        )
        for lay in _candidates(
            model,
            cluster,
            n_gpus,
            seqs,
            uneven_stages,
            _v.count("max_micro_batch", max_micro_batch, minimum=1),
        )
    ]
    if not rows:
        raise ValueError(
            f"gpus = {n_gpus}: no dp x tp x pp layout divides it with tp dividing "
            f"the heads ({model.heads}, KV {model.kv_heads}) and dp dividing the "
            f"global batch of {seqs} sequences"
        )
    df = pd.DataFrame(rows)
    fits = df[df["fits"]].sort_values(["step_s", "memory_GB"], kind="stable").reset_index(drop=True)
    fits.insert(0, "rank", range(1, len(fits) + 1))
    rejected = df[~df["fits"]].sort_values("memory_GB", kind="stable").reset_index(drop=True)
    fits.attrs["rejected"] = rejected
    fits.attrs["inputs"] = {
        "model": model,
        "cluster": cluster,
        "gpus": n_gpus,
        "global_batch_tokens": tokens,
        "total_tokens": total_tokens,
        "efficiency": efficiency,
        "reserve": reserve,
        "uneven_stages": uneven_stages,
        "usable_GB": (1 - reserve) * cluster.memory_bytes / 1e9,
    }
    return fits


def _family(row) -> str:
    return f"TP {row['tp']} x PP {row['pp']} x DP {row['dp']}"


def explain(result, *, families: int = 8) -> str:
    """Why the top plan of :func:`plan` wins, and why each other (tp, pp) family loses: it does
    not fit (its smallest plan and the biggest part of it), or its best plan is slower -- by the
    part of the step that grew most (pipeline bubble, TP over the network or NVLink, DP traffic,
    recomputation, uneven stages)."""
    inputs = result.attrs.get("inputs")
    if inputs is None:
        raise ValueError(
            "result: expected the DataFrame plan() returns (its attrs hold the inputs)"
        )
    cl, usable = inputs["cluster"], inputs["usable_GB"]
    rejected = result.attrs["rejected"]
    if result.empty:
        best = rejected.iloc[0]
        big = max(MEMORY_CATEGORIES, key=lambda k: best[f"{k}_GB"])
        return (
            f"Nothing fits: the smallest layout, {_family(best)} with ZeRO-{best['zero']} and "
            f"{best['recompute']} recomputation, needs {best['memory_GB']:.1f} GB per GPU "
            f"(largest part: {big}, {best[big + '_GB']:.1f} GB) of {usable:.1f} usable. "
            "More GPUs, a smaller batch per GPU, offload, or LoRA instead of full training."
        )
    top = result.iloc[0]
    lines = [
        f"Winner: {_family(top)}, ZeRO-{top['zero']}, {top['recompute']} recomputation, "
        f"micro-batch {top['micro_batch']}"
        + (f", v = {top['v']}" if top["v"] > 1 else "")
        + f": {top['memory_GB']:.1f} GB per GPU of {usable:.1f} usable, step "
        f"{top['step_s']:.2f} s, MFU {top['mfu']:.0%}.",
        "  Its step: "
        + ", ".join(
            f"{k[:-2].replace('_', ' ')} {top[k] / top['step_s']:.0%}"
            for k in TIME_PARTS
            if top[k] > 0
        )
        + ".",
    ]
    seen = {(top["tp"], top["pp"])}
    keys = result.groupby(["tp", "pp"], sort=False).head(1)
    shown = 0
    for _, row in keys.iterrows():
        if (row["tp"], row["pp"]) in seen or shown >= families:
            continue
        seen.add((row["tp"], row["pp"]))
        shown += 1
        grew = {k: row[k] - top[k] for k in TIME_PARTS}
        cause = max(grew, key=grew.get)
        why = {
            "bubble_s": f"pipeline bubble {row['bubble_fraction']:.0%} of the step "
            f"({row['microbatches']} micro-batches on {row['pp']} stages)",
            "tp_comm_s": (
                "tensor parallelism across nodes, over the network"
                if row["tp"] > cl.gpus_per_node
                else "tensor-parallel all-reduces"
            ),
            "dp_comm_s": f"data-parallel traffic not hidden by backward (ZeRO-{row['zero']})",
            "recompute_s": f"{row['recompute']} recomputation to fit",
            "compute_s": "a slowest stage (the output layer or more layers on it) setting the pace",
            "p2p_s": "stage-to-stage sends",
        }[cause]
        lines.append(
            f"- {_family(row)}: fits, but {row['step_s'] / top['step_s'] - 1:+.0%} "
            f"step time; the main cost: {why} (+{grew[cause]:.2f} s)."
        )

    def no_fit(best, label):
        big = max(MEMORY_CATEGORIES, key=lambda k: best[f"{k}_GB"])
        return (
            f"- {label}: doesn't fit; its smallest plan needs {best['memory_GB']:.1f} GB > "
            f"{usable:.1f} (largest part: {big}, {best[big + '_GB']:.1f} GB)."
        )

    if not rejected.empty:
        fitting_zero = set(zip(result["tp"], result["pp"], result["zero"]))
        same = rejected[(rejected.tp == top["tp"]) & (rejected.pp == top["pp"])]
        for zero, grp in same.groupby("zero"):  # the winner's layout with less sharding
            if (top["tp"], top["pp"], zero) not in fitting_zero:
                lines.append(no_fit(grp.iloc[0], f"{_family(top)} with ZeRO-{zero}"))
        for (tp, pp), grp in rejected.groupby(["tp", "pp"], sort=False):
            if (tp, pp) in seen or shown >= families:
                continue
            seen.add((tp, pp))
            shown += 1
            lines.append(no_fit(grp.iloc[0], _family(grp.iloc[0])))
    return "\n".join(lines)
