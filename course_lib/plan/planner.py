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
compute). MFU = model FLOPs (``ModelSpec.flops_per_token``: PaLM's 6 N + 12 L h s per token, N
the parameters matrix products use) / (step time x GPUs x peak); HFU counts recomputation too.
Introduced in notebooks/14_planning_a_run.ipynb.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "DEFAULT_EFFICIENCY",
    "DEFAULT_RESERVE",
    "step_time",
    "plan",
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


def _stage_flops(model: ModelSpec, layout: Layout, layers: int, *, output: bool) -> tuple[int, int]:
    """(model FLOPs, recomputed FLOPs) per token of a stage of ``layers`` layers, with the output
    layer's 6 V h when ``output``."""
    h, s, per_layer = model.hidden, model.seq_len, model.params()["per_layer"]
    flops = estimate.training_flops_per_token(layers * per_layer, layers=layers, hidden=h, seq=s)
    extra = estimate.recompute_flops_per_token(
        per_layer, layers=layers, hidden=h, seq=s, recompute=layout.recompute
    )
    return flops + (6 * model.vocab * h if output else 0), extra


def _compute_s(
    model: ModelSpec, cluster: ClusterSpec, layout: Layout, stages: tuple[int, int], eff: float
) -> tuple[float, float]:
    """(compute, recompute) seconds of one micro-batch on the slowest stage: a middle one (the
    first of ``stages``' layer counts) or the last with the output layer (the second)."""
    n, n_last = stages
    rate = eff * cluster.peak_flops
    tokens = layout.micro_batch * model.seq_len
    slow = max(
        _stage_flops(model, layout, n, output=layout.pp == 1),
        _stage_flops(model, layout, n_last, output=True),
        key=sum,
    )
    return slow[0] * tokens / layout.tp / rate, slow[1] * tokens / layout.tp / rate


def _tp_comm_s(model: ModelSpec, cluster: ClusterSpec, layout: Layout, layers: int) -> float:
    """Seconds of one micro-batch's tensor-parallel all-reduces on a stage of ``layers``."""
    t, b, s, h = layout.tp, layout.micro_batch, model.seq_len, model.hidden
    if t == 1:
        return 0.0
    payload = 2 * s * b * h
    calls = estimate.tp_payload_bytes_per_layer(s, b, h, recompute=layout.recompute) // payload
    if t <= cluster.gpus_per_node:
        one = estimate.allreduce_time(payload, t, bandwidth=cluster.intra_GBps * 1e9)
    else:
        g = cluster.gpus_per_node
        one = _allreduce_s(payload, t, cluster, nodes=t // g, per_node=g)
    return layers * calls * one


def _p2p_s(model: ModelSpec, cluster: ClusterSpec, layout: Layout) -> float:
    """Seconds of one micro-batch's stage-boundary sends, each way, v times when interleaved."""
    if layout.pp == 1:
        return 0.0
    across = layout.tp * layout.dp >= cluster.gpus_per_node
    bw = (cluster.inter_GBps if across else cluster.intra_GBps) * 1e9
    boundary = estimate.pipeline_boundary_bytes(layout.micro_batch, model.seq_len, model.hidden) / (
        layout.tp if layout.sequence_parallel else 1
    )
    return 2 * layout.virtual_stages * boundary / bw


def _dp_comm_s(
    cluster: ClusterSpec, layout: Layout, stage_params: int, work_s: float, microbatches: int
) -> float:
    """Seconds of data-parallel traffic backward does not hide, per step: the bf16 gradients of
    the fullest stage's ``stage_params`` on one rank; ``work_s``: one micro-batch's compute and
    recomputation."""
    if layout.dp == 1:
        return 0.0
    grad_bytes = 2 * -(-stage_params // layout.tp)
    nodes, per_node = _dp_group(cluster, layout)
    allreduce = _allreduce_s(grad_bytes, layout.dp, cluster, nodes=nodes, per_node=per_node)
    backward = 2 / 3 * work_s  # backward of one micro-batch
    if layout.zero <= 1:
        return estimate.ddp_exposed_comm_time(
            -(-grad_bytes // 32),
            grad_bytes=grad_bytes,
            backward_s=backward,
            alpha=0.0,
            beta=allreduce / grad_bytes,
        )
    if layout.zero == 2:
        return microbatches * max(0.0, allreduce / 2 - backward)
    # gather weights for forward and backward, reduce-scatter gradients, every micro-batch
    return microbatches * max(0.0, 1.5 * allreduce - work_s)


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
    ``step_s``, ``microbatches``, ``bubble_fraction``, ``mfu``, ``hfu``, ``tokens_per_s``. See the module
    docstring for the model; every term comes from ``estimate``."""
    check_layout(
        model, layout, cluster, global_batch_tokens=global_batch_tokens, uneven_stages=uneven_stages
    )
    eff = _v.number("efficiency", efficiency, positive=True, maximum=1)
    p, v = layout.pp, layout.virtual_stages
    m = microbatches(model, layout, global_batch_tokens)
    n, n_last = stage_layers(model, p, uneven_stages=uneven_stages)
    parts = model.params()
    compute, recompute = _compute_s(model, cluster, layout, (n, n_last), eff)
    tp_comm = _tp_comm_s(model, cluster, layout, n)
    p2p = _p2p_s(model, cluster, layout)
    per_mb = compute + recompute + tp_comm + p2p
    bubble_fraction = estimate.pipeline_bubble_fraction(p, m, v)
    pipeline = m * per_mb / (1 - bubble_fraction)
    stage_params = max(
        n * parts["per_layer"] + parts["embedding"],
        n_last * parts["per_layer"] + (parts["output"] or parts["embedding"]),
    )
    dp_comm = _dp_comm_s(cluster, layout, stage_params, compute + recompute, m)
    step = pipeline + dp_comm
    model_flops, hardware_flops = (
        global_batch_tokens * f for f in model.flops_per_token(layout.recompute)
    )
    return {
        "compute_s": m * compute,
        "recompute_s": m * recompute,
        "tp_comm_s": m * tp_comm,
        "p2p_s": m * p2p,
        "bubble_s": pipeline - m * per_mb,
        "dp_comm_s": dp_comm,
        "step_s": step,
        "microbatches": m,
        "bubble_fraction": bubble_fraction,
        "mfu": model_flops / (step * layout.gpus * cluster.peak_flops),
        "hfu": hardware_flops / (step * layout.gpus * cluster.peak_flops),
        "tokens_per_s": global_batch_tokens / step,
    }


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
) -> dict[str, Any]:
    """One row of :func:`plan` for one layout: the layout, memory by category (GB), whether it
    fits in (1 - reserve) of the GPU's memory, and the step time by part."""
    mem = predict_memory(
        model, layout, global_batch_tokens=global_batch_tokens, uneven_stages=uneven_stages
    )
    usable = (1 - _v.number("reserve", reserve, minimum=0, maximum=0.9)) * cluster.memory_bytes
    row: dict[str, Any] = {
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


def _candidates(
    model: ModelSpec,
    cluster: ClusterSpec,
    gpus: int,
    seqs: int,
    uneven_stages: bool,
    max_micro_batch: int,
) -> Iterator[Layout]:
    """Every layout :func:`plan` weighs (see its docstring)."""
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


def _plan_inputs(
    model: ModelSpec, cluster: ClusterSpec, gpus: int | None, global_batch_tokens: int
) -> tuple[int, int]:
    """(GPUs, global batch in tokens) after checking :func:`plan`'s arguments."""
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
    return n_gpus, tokens


def _ranked(df: pd.DataFrame) -> pd.DataFrame:
    """The layouts that fit, fastest first (``rank`` 1), the others in ``attrs["rejected"]``,
    smallest first."""
    fits = df[df["fits"]].sort_values(["step_s", "memory_GB"], kind="stable").reset_index(drop=True)
    fits.insert(0, "rank", range(1, len(fits) + 1))
    rejected = df[~df["fits"]].sort_values("memory_GB", kind="stable").reset_index(drop=True)
    fits.attrs["rejected"] = rejected
    return fits


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
) -> pd.DataFrame:
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

    n_gpus, tokens = _plan_inputs(model, cluster, gpus, global_batch_tokens)
    seqs = tokens // model.seq_len
    one = functools.partial(
        evaluate,
        model,
        cluster,
        global_batch_tokens=tokens,
        total_tokens=total_tokens,
        efficiency=efficiency,
        reserve=reserve,
        uneven_stages=uneven_stages,
    )
    most = _v.count("max_micro_batch", max_micro_batch, minimum=1)
    rows = [one(lay) for lay in _candidates(model, cluster, n_gpus, seqs, uneven_stages, most)]
    if not rows:
        raise ValueError(
            f"gpus = {n_gpus}: no dp x tp x pp layout divides it with tp dividing "
            f"the heads ({model.heads}, KV {model.kv_heads}) and dp dividing the "
            f"global batch of {seqs} sequences"
        )
    fits = _ranked(pd.DataFrame(rows))
    fits.attrs["inputs"] = {
        **dict(model=model, cluster=cluster, gpus=n_gpus, global_batch_tokens=tokens),
        **dict(total_tokens=total_tokens, efficiency=efficiency, reserve=reserve),
        "uneven_stages": uneven_stages,
        "usable_GB": (1 - reserve) * cluster.memory_bytes / 1e9,
    }
    return fits
