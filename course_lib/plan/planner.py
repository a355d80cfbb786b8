"""The planner: every layout of a model on a cluster in five dimensions (dp x tp x pp x cp, ep
carved out of dp; x ZeRO stage, recomputation, micro-batch, interleaving), its memory per GPU
and its step time, ranked; and why the winner wins.

Step time of one layout, per micro-batch on the slowest pipeline stage (the one with the most
layers, plus the output layer on the last stage), each rank doing 1 / (tp cp) of its tokens:

* compute: its model FLOPs (``estimate.training_flops_per_token``: 6 P + 12 s h per layer per
  token, P what a token uses of an MoE layer; 6 V h for the output layer) at
  ``Assumptions.matmul_efficiency`` x the GPU's peak (weight products twice as fast with fp8);
* recompute: the FLOPs recomputation adds, at the same rate;
* TP, CP, EP and stage-to-stage traffic (``plan.comm_model``): bytes from ``estimate`` on the
  link each group spans, alpha per message, two levels across nodes, each term less the
  fraction ``Assumptions`` says overlaps compute;

then the pipeline: (m + (p-1)/v) micro-batch times (the bubble is ``estimate.
pipeline_bubble_fraction`` of the total), plus the data-parallel gradient traffic backward does
not hide (``comm_model.dp_comm_s``). MFU = model FLOPs (``ModelSpec.flops_per_token``: PaLM's
6 N + 12 L h s per token, N the parameters matrix products use) / (step time x GPUs x peak);
HFU counts recomputation too. Introduced in notebooks/14_planning_a_run.ipynb.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from course_lib import validate as _v
from course_lib.measure import estimate
from course_lib.plan import comm_model as cm
from course_lib.plan import search
from course_lib.plan.comm_model import DEFAULT_ASSUMPTIONS, Assumptions
from course_lib.plan.memory import (
    MEMORY_CATEGORIES,
    check_layout,
    microbatches,
    predict_memory,
    stage_layers,
)
from course_lib.plan.specs import ClusterSpec, Layout, ModelSpec

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

#: the matmul efficiency the planner assumes unless told otherwise (``Assumptions``)
DEFAULT_EFFICIENCY = DEFAULT_ASSUMPTIONS.matmul_efficiency
#: fraction of each GPU's memory left for the CUDA context, NCCL buffers and fragmentation
DEFAULT_RESERVE = 0.05
#: the parts of a step, in seconds, as :func:`step_time` returns them
TIME_PARTS = (
    "compute_s",
    "recompute_s",
    "tp_comm_s",
    "cp_comm_s",
    "ep_comm_s",
    "p2p_s",
    "bubble_s",
    "dp_comm_s",
)


def _stage_flops(
    model: ModelSpec, layout: Layout, layers: int, *, output: bool
) -> tuple[int, int, int]:
    """(weight-product FLOPs, attention FLOPs, recomputed FLOPs) per token of a stage of
    ``layers`` layers (MoE layers where the model has experts: the parameters a token uses),
    with the output layer's 6 V h when ``output``."""
    h, s = model.hidden, model.seq
    per_layer = model.layer_params()["moe_active" if model.experts else "dense"]
    weights = estimate.training_flops_per_token(layers * per_layer)
    attention = estimate.training_flops_per_token(0, layers=layers, hidden=h, seq=s)
    extra = estimate.recompute_flops_per_token(
        per_layer, layers=layers, hidden=h, seq=s, recompute=layout.recompute
    )
    out = estimate.training_flops_per_token(model.vocab * h) if output else 0
    return weights + out, attention, extra


def _compute_s(
    model: ModelSpec,
    cluster: ClusterSpec,
    layout: Layout,
    stages: tuple[int, int],
    how: Assumptions,
) -> tuple[float, float]:
    """(compute, recompute) seconds of one micro-batch on the slowest stage: a middle one (the
    first of ``stages``' layer counts) or the last with the output layer (the second). Each rank
    does 1 / (tp cp) of the stage's work; weight products at twice the rate with ``fp8``."""
    n, n_last = stages
    rate = how.matmul_efficiency * cluster.peak_flops
    speedup = 2 if how.fp8 else 1
    per_rank = layout.micro_batch * model.seq / (layout.tp * layout.cp)

    def seconds(flops: tuple[int, int, int]) -> tuple[float, float]:
        weights, attention, extra = flops
        return (weights / speedup + attention) * per_rank / rate, extra * per_rank / rate

    return max(
        seconds(_stage_flops(model, layout, n, output=layout.pp == 1)),
        seconds(_stage_flops(model, layout, n_last, output=True)),
        key=sum,
    )


def _stage_grads(model: ModelSpec, layout: Layout, stages: tuple[int, int]) -> tuple[int, int]:
    """(dense, routed-expert) parameters of the fullest stage on one rank: its layers' share
    over tp (the routed experts also over ep) and the embedding or the output layer."""
    n, n_last = stages
    parts, lp = model.params(), model.layer_params()
    dense_layer = lp["moe"] - lp["routed"]
    dense = max(
        n * dense_layer + parts["embedding"],
        n_last * dense_layer + (parts["output"] or parts["embedding"]),
    )
    routed = n * lp["routed"] // layout.ep if model.experts else 0
    return -(-dense // layout.tp), routed // layout.tp


def _comm(
    model: ModelSpec, cluster: ClusterSpec, layout: Layout, layers: int, how: Assumptions
) -> dict[str, float]:
    """Exposed seconds of one micro-batch's TP, CP, EP and stage-to-stage traffic."""
    return {
        "tp_comm_s": cm.tp_comm_s(model, cluster, layout, layers, how.tp_overlap),
        "cp_comm_s": cm.cp_comm_s(model, cluster, layout, layers, how.cp_overlap),
        "ep_comm_s": cm.ep_comm_s(model, cluster, layout, layers, how.ep_overlap),
        "p2p_s": cm.p2p_s(model, cluster, layout, how.p2p_overlap),
    }


def step_time(
    model: ModelSpec,
    cluster: ClusterSpec,
    layout: Layout,
    *,
    global_batch_tokens: int,
    assumptions: Assumptions = DEFAULT_ASSUMPTIONS,
    uneven_stages: bool = False,
) -> dict[str, float]:
    """Seconds of one training step under ``layout``, by part (:data:`TIME_PARTS`), with
    ``latency_s`` (the part of the TP, CP, EP and stage-to-stage terms that is per-message
    latency: it scales with the number of micro-batches, the rest with the bytes), ``step_s``,
    ``microbatches``, ``bubble_fraction``, ``mfu``, ``hfu``, ``tokens_per_s``. See the module
    docstring for the model; every term comes from ``estimate`` through ``plan.comm_model``."""
    check_layout(
        model, layout, cluster, global_batch_tokens=global_batch_tokens, uneven_stages=uneven_stages
    )
    if not isinstance(assumptions, Assumptions):
        raise TypeError(f"assumptions = {assumptions!r}: expected a plan.Assumptions")
    how, p, v = assumptions, layout.pp, layout.virtual_stages
    m = microbatches(model, layout, global_batch_tokens)
    stages = stage_layers(model, p, uneven_stages=uneven_stages)
    compute, recompute = _compute_s(model, cluster, layout, stages, how)
    comm = _comm(model, cluster, layout, stages[0], how)
    latency = sum(comm.values()) - sum(
        _comm(model, cm.no_latency(cluster), layout, stages[0], how).values()
    )
    per_mb = compute + recompute + sum(comm.values())
    bubble_fraction = estimate.pipeline_bubble_fraction(p, m, v)
    pipeline = m * per_mb / (1 - bubble_fraction)
    grads = _stage_grads(model, layout, stages)
    dp_comm = cm.dp_comm_s(
        cluster, layout, grads, compute + recompute, (m, stages[0]), how.dp_overlap
    )
    step = pipeline + dp_comm
    model_flops, hardware_flops = (
        global_batch_tokens * f for f in model.flops_per_token(layout.recompute)
    )
    return {
        "compute_s": m * compute,
        "recompute_s": m * recompute,
        **{k: m * t for k, t in comm.items()},
        "bubble_s": pipeline - m * per_mb,
        "dp_comm_s": dp_comm,
        "latency_s": m * latency,
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
    assumptions: Assumptions = DEFAULT_ASSUMPTIONS,
    reserve: float = DEFAULT_RESERVE,
    uneven_stages: bool = False,
    timed: bool = True,
) -> dict[str, Any]:
    """One row of :func:`plan` for one layout: the layout, memory by category (GB), whether it
    fits in (1 - reserve) of the GPU's memory, and (unless ``timed`` is False) the step time by
    part."""
    mem = predict_memory(
        model, layout, global_batch_tokens=global_batch_tokens, uneven_stages=uneven_stages
    )
    usable = (1 - _v.number("reserve", reserve, minimum=0, maximum=0.9)) * cluster.memory_bytes
    row: dict[str, Any] = {
        **{k: getattr(layout, k) for k in ("dp", "tp", "pp", "cp", "ep", "zero", "recompute")},
        "micro_batch": layout.micro_batch,
        "v": layout.virtual_stages,
        "memory_GB": mem["total"] / 1e9,
        **{f"{k}_GB": mem[k] / 1e9 for k in MEMORY_CATEGORIES},
        "fits": mem["total"] <= usable,
    }
    if not timed:
        return row
    row.update(
        step_time(
            model,
            cluster,
            layout,
            global_batch_tokens=global_batch_tokens,
            assumptions=assumptions,
            uneven_stages=uneven_stages,
        )
    )
    if total_tokens is not None:
        row["days"] = (
            _v.number("total_tokens", total_tokens, positive=True) / row["tokens_per_s"] / 86400
        )
    return row


def _ranked(df: pd.DataFrame) -> pd.DataFrame:
    """The layouts that fit, fastest first (``rank`` 1), the others in ``attrs["rejected"]``,
    smallest first."""
    if "step_s" not in df:  # nothing fits, so nothing was timed
        df = df.assign(**{k: float("nan") for k in ("step_s", *TIME_PARTS, "mfu", "hfu")})
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
    assumptions: Assumptions = DEFAULT_ASSUMPTIONS,
    reserve: float = DEFAULT_RESERVE,
    uneven_stages: bool = False,
    max_micro_batch: int = 8,
    allow_tp_across_nodes: bool = False,
    only: Mapping[str, Sequence[Any]] | None = None,
) -> pd.DataFrame:
    """Every layout of ``model`` on ``gpus`` GPUs of ``cluster`` (all of them by default) that
    fits, ranked by step time: a pandas DataFrame, one row per layout (``rank`` 1 = fastest),
    with memory per GPU by category (GB), the step time by part (s), MFU, HFU, tokens/s and,
    with ``total_tokens``, days. Layouts that do not fit are in ``result.attrs["rejected"]``
    (memory only); the inputs in ``result.attrs["inputs"]`` (what :func:`explain` reads).

    The search (``plan.search.candidates``): tp dividing the heads and the KV heads, inside a
    node unless ``allow_tp_across_nodes`` (then priced on the network it crosses); cp a power
    of two leaving each rank at least ``search.MIN_CP_TOKENS`` tokens; pp dividing the layers
    (any pp with ``uneven_stages``); dp = gpus / (tp cp pp) dividing the global batch in
    sequences; for an MoE model ep dividing dp and the experts; micro-batch sizes up to
    ``max_micro_batch`` that divide each replica's share; ZeRO 0-3; recomputation none /
    selective / full; interleaving v in 1, 2, 4, 8. ``only`` narrows any of these to the values given, e.g. ``only={"tp": [8], "pp": [16]}``.

    Refused before any search: a global batch above ``search.MAX_BATCH_SEQUENCES`` sequences,
    ``max_micro_batch`` above ``search.MAX_MICRO_BATCH``, and a value of ``only`` no layout can
    have (pp above the layers, a tp that does not divide the heads, ...).
    """
    import pandas as pd

    n_gpus, tokens = search.plan_inputs(model, cluster, gpus, global_batch_tokens)
    if not isinstance(assumptions, Assumptions):
        raise TypeError(f"assumptions = {assumptions!r}: expected a plan.Assumptions")
    most = _v.count("max_micro_batch", max_micro_batch, minimum=1, maximum=search.MAX_MICRO_BATCH)
    search.check_only(model, only, uneven_stages)  # a layout no search could build: refused now
    kw: dict[str, Any] = dict(global_batch_tokens=tokens, reserve=reserve)
    kw |= dict(uneven_stages=uneven_stages, assumptions=assumptions, total_tokens=total_tokens)
    rows = []
    for layout in search.candidates(
        model, cluster, n_gpus, tokens, uneven_stages, most, allow_tp_across_nodes, only
    ):
        row = evaluate(model, cluster, layout, timed=False, **kw)
        rows.append(evaluate(model, cluster, layout, **kw) if row["fits"] else row)
    if not rows:
        raise ValueError(search.no_layout_message(model, n_gpus, tokens, only))
    fits = _ranked(pd.DataFrame(rows))
    fits.attrs["inputs"] = {
        **dict(model=model, cluster=cluster, gpus=n_gpus, global_batch_tokens=tokens),
        **dict(total_tokens=total_tokens, assumptions=assumptions, reserve=reserve),
        "uneven_stages": uneven_stages,
        "usable_GB": (1 - reserve) * cluster.memory_bytes / 1e9,
    }
    return fits
