"""The planner: every layout of a model on a cluster in five dimensions (dp x tp x pp x cp, ep
carved out of dp; x ZeRO stage, recomputation, micro-batch, interleaving), its memory per GPU
and its step time, ranked; and why the winner wins.

Step time of one layout, per micro-batch on the slowest pipeline stage (the one with the most
layers, plus the output layer on the last stage), each rank doing 1 / (tp cp) of its tokens:

* compute: its model FLOPs (``estimate.training_flops_per_token``: 6 P + 12 s h per layer per
  token, P what a token uses of an MoE layer; 6 V h for the output layer) at
  ``Assumptions.matmul_efficiency`` x the GPU's peak (weight products twice as fast with fp8);
* recompute: the FLOPs recomputation adds, at the same rate (both ``plan.compute_time``; by
  shape with ``Assumptions(matmul_model="by shape")``);
* TP, CP, EP and stage-to-stage traffic (``plan.comm_model``): bytes from ``estimate`` on the
  link each group spans, alpha per message, two levels across nodes, each term less the
  fraction ``Assumptions`` says overlaps compute;

then the pipeline: (m + (p-1)/v) micro-batch times (the bubble is ``estimate.
pipeline_bubble_fraction`` of the total), plus the data-parallel gradient traffic backward does
not hide (``comm_model.dp_comm_s``). MFU = model FLOPs (``ModelSpec.flops_per_token``: PaLM's
6 N + 12 L h s per token, N the parameters matrix products use) / (step time x GPUs x peak);
HFU counts recomputation too. :func:`plan` prices each of these parts once per family of
layouts that share it (``_step_time``'s memo; ``memory.worst_stage_memory``'s), with the
same numbers as :func:`evaluate` on each layout alone. Introduced in
notebooks/14_planning_a_run.ipynb.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from course_lib import validate as _v
from course_lib.measure import estimate
from course_lib.plan import comm_model as cm
from course_lib.plan import moe_time, search
from course_lib.plan.comm_model import DEFAULT_ASSUMPTIONS, Assumptions
from course_lib.plan.compute_time import compute_s, shape_layer
from course_lib.plan.memory import (
    MEMORY_CATEGORIES,
    check_layout,
    predict_memory,
    stage_layers,
    worst_stage_memory,
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


def _stage_grads(model: ModelSpec, layout: Layout, stages: tuple[int, int]) -> tuple[int, int]:
    """(dense, routed-expert) parameters of the fullest stage on one rank: its layers' share
    over tp (the routed experts over ``Layout.expert_split``'s ranks: tp x ep, or folded ep x
    etp) and the embedding or the output layer."""
    n, n_last = stages
    parts, lp = model.params(), model.layer_params()
    dense_layer = lp["moe"] - lp["routed"] + model.kv_replicated(layout.tp)
    dense = max(
        n * dense_layer + parts["embedding"],
        n_last * dense_layer + (parts["output"] or parts["embedding"]),
    )
    routed = n * lp["routed"] // layout.expert_split[0] if model.experts else 0
    return -(-dense // layout.tp), routed


def _comm(
    model: ModelSpec,
    cluster: ClusterSpec,
    layout: Layout,
    layers: int,
    how: Assumptions,
    layer_s: float,
) -> dict[str, float]:
    """Exposed seconds of one micro-batch's TP, CP and EP traffic (EP: ``plan.moe_time``,
    hidden as ``how.ep_schedule`` says behind ``layer_s``, one layer's compute); the
    stage-to-stage sends are ``comm_model.p2p_s``."""
    return {
        "tp_comm_s": cm.tp_comm_s(model, cluster, layout, layers, how.tp_overlap),
        "cp_comm_s": cm.cp_comm_s(model, cluster, layout, layers, how.cp_overlap),
        "ep_comm_s": moe_time.ep_exposed_s(model, cluster, layout, layers, how, layer_s)[0],
    }


def _moe_row(
    model: ModelSpec, cluster: ClusterSpec, layout: Layout, how: Assumptions, mn: tuple[int, int]
) -> dict[str, float]:
    """``ep_all_to_all_s``: the step's all-to-all seconds before any hiding (``ep_comm_s`` is
    what stays exposed); ``expert_gemm_efficiency``: the fraction of the peak the routed
    experts' products reach (by shape; ``matmul_efficiency`` when flat; nan when dense)."""
    if not model.experts:
        return {"ep_all_to_all_s": 0.0, "expert_gemm_efficiency": float("nan")}
    total = moe_time.ep_exposed_s(model, cluster, layout, mn[1], how, 0.0)[1]
    eff = how.matmul_efficiency
    if how.matmul_model == "by shape":
        eff = shape_layer(model, cluster, layout, how).expert_efficiency
    return {"ep_all_to_all_s": mn[0] * total, "expert_gemm_efficiency": eff}


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
    ``microbatches``, ``bubble_fraction``, ``mfu``, ``hfu`` (against the bf16 peak, what
    ``ClusterSpec.peak_flops`` is), ``mfu_fp8_peak`` (with ``Assumptions.fp8``: the same model
    FLOPs against the FP8 peak, ``ClusterSpec.fp8_flops``; nan without), ``tokens_per_s``, and
    for an MoE model ``ep_all_to_all_s`` and ``expert_gemm_efficiency``. See the module
    docstring for the model; every term comes from ``estimate`` through ``plan.comm_model``."""
    kw: dict[str, Any] = dict(global_batch_tokens=global_batch_tokens, uneven_stages=uneven_stages)
    check_layout(model, layout, cluster, **kw)
    if not isinstance(assumptions, Assumptions):
        raise TypeError(f"assumptions = {assumptions!r}: expected a plan.Assumptions")
    return _step_time(model, cluster, layout, global_batch_tokens, assumptions, uneven_stages, {})


def _once(memo: dict[Any, Any], key: Any, make: Any) -> Any:
    """``memo[key]``, made by ``make()`` the first time."""
    if key not in memo:
        memo[key] = make()
    return memo[key]


def _micro_batch(
    model: ModelSpec,
    cluster: ClusterSpec,
    layout: Layout,
    stages: tuple[int, int],
    how: Assumptions,
    memo: dict[Any, Any],
) -> tuple[float, float, dict[str, float], float]:
    """(compute, recompute, exposed traffic by part, its latency) of one micro-batch on the
    slowest stage, each part counted once per :func:`_family` in ``memo``: the stage-to-stage
    sends once per family and v, the rest once per family (the ZeRO stage changes none)."""
    family = _family(layout)
    compute, recompute = _once(
        memo, ("compute", family), lambda: compute_s(model, cluster, layout, stages, how)
    )
    layer_s = (compute + recompute) / stages[0]
    bare = _once(memo, "no latency", lambda: cm.no_latency(cluster))
    groups, groups_bare = _once(
        memo,
        ("comm", family),
        lambda: tuple(_comm(model, c, layout, stages[0], how, layer_s) for c in (cluster, bare)),
    )
    p2p, p2p_bare = _once(
        memo,
        ("p2p", family, layout.virtual_stages),
        lambda: tuple(cm.p2p_s(model, c, layout, how.p2p_overlap) for c in (cluster, bare)),
    )
    comm = {**groups, "p2p_s": p2p}
    latency = sum(comm.values()) - sum({**groups_bare, "p2p_s": p2p_bare}.values())
    return compute, recompute, comm, latency


def _family(layout: Layout) -> tuple[Any, ...]:
    """What every term of a micro-batch but the stage-to-stage sends depends on: the layout
    less its ZeRO stage and interleaving."""
    dims = (layout.dp, layout.tp, layout.pp, layout.cp, layout.ep, layout.etp)
    settings = (layout.recompute, layout.kernel, layout.sequence_parallel, layout.cp_method)
    return (*dims, layout.micro_batch, *settings)


def _step_time(
    model: ModelSpec,
    cluster: ClusterSpec,
    layout: Layout,
    global_batch_tokens: int,
    how: Assumptions,
    uneven_stages: bool,
    memo: dict[Any, Any],
) -> dict[str, float]:
    """:func:`step_time` of a checked layout. ``memo`` keeps what layouts of one plan share
    (the same model, cluster, batch and assumptions; :func:`_micro_batch`), so that
    :func:`plan` prices each family once; a fresh ``memo`` prices everything again."""
    p, v, family = layout.pp, layout.virtual_stages, _family(layout)
    m = global_batch_tokens // model.seq // (layout.dp * layout.micro_batch)
    stages = _once(memo, p, lambda: stage_layers(model, p, uneven_stages=uneven_stages))
    compute, recompute, comm, latency = _micro_batch(model, cluster, layout, stages, how, memo)
    work = compute + recompute
    per_mb = work + sum(comm.values())
    bubble_fraction = estimate.pipeline_bubble_fraction(p, m, v)
    pipeline = m * per_mb / (1 - bubble_fraction)
    grads = _once(memo, ("grads", family), lambda: _stage_grads(model, layout, stages))
    dp_comm = _once(
        memo,
        ("dp", family, layout.zero, layout.grad_bytes),
        lambda: cm.dp_comm_s(cluster, layout, grads, work, (m, stages[0]), how.dp_overlap),
    )
    step = pipeline + dp_comm
    flops = _once(
        memo,
        ("flops", layout.recompute, layout.kernel),
        lambda: model.flops_per_token(layout.recompute, layout.kernel),
    )
    model_flops, hardware_flops = (global_batch_tokens * f for f in flops)
    nan = float("nan")
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
        # FP8 products: the same model FLOPs against the FP8 peak too, named apart
        "mfu_fp8_peak": model_flops / (step * layout.gpus * cluster.fp8_flops) if how.fp8 else nan,
        "tokens_per_s": global_batch_tokens / step,
        **_once(
            memo, ("moe", family), lambda: _moe_row(model, cluster, layout, how, (m, stages[0]))
        ),
    }


def _memory_row(layout: Layout, mem: dict[str, Any], usable: float) -> dict[str, Any]:
    """The layout and its memory by category (GB), and whether it fits in ``usable`` bytes."""
    return {
        **{
            k: getattr(layout, k)
            for k in ("dp", "tp", "pp", "cp", "ep", "etp", "zero", "recompute")
        },
        "micro_batch": layout.micro_batch,
        "v": layout.virtual_stages,
        "memory_GB": mem["total"] / 1e9,
        **{f"{k}_GB": mem[k] / 1e9 for k in MEMORY_CATEGORIES},
        "fits": mem["total"] <= usable,
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
    row = _memory_row(layout, mem, usable)
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
    sequences; for an MoE model ep dividing dp and the experts, and the larger ep that folding
    the experts over a stage's tp x cp x dp ranks allows (``etp`` 1); micro-batch sizes up to
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
    if total_tokens is not None:
        _v.number("total_tokens", total_tokens, positive=True)
    usable = (1 - _v.number("reserve", reserve, minimum=0, maximum=0.9)) * cluster.memory_bytes
    seqs = tokens // model.seq
    rows: list[dict[str, Any]] = []
    memo: dict[Any, Any] = {"memory": {}}  # what the layouts share (``_step_time``, memory's)
    for layout in search.candidates(
        model, cluster, n_gpus, tokens, uneven_stages, most, allow_tp_across_nodes, only
    ):
        # what evaluate() does, for a layout the search built valid, sharing ``memo``
        m = seqs // (layout.dp * layout.micro_batch)
        mem = worst_stage_memory(model, layout, m, uneven_stages, memo["memory"])
        row = _memory_row(layout, mem, usable)
        if row["fits"]:  # time it (its memory is counted)
            row.update(_step_time(model, cluster, layout, tokens, assumptions, uneven_stages, memo))
            if total_tokens is not None:
                row["days"] = total_tokens / row["tokens_per_s"] / 86400
        rows.append(row)
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
