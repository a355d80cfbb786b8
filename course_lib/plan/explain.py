"""Why the planner's winner wins: :func:`explain` reads the DataFrame :func:`plan.plan` returns
and names, for each other (tp, pp) family, the part of the step that grew most or the memory
category that does not fit. Introduced in notebooks/14_planning_a_run.ipynb."""

from __future__ import annotations

from typing import Any

from course_lib import validate as _v
from course_lib.plan.memory import MEMORY_CATEGORIES
from course_lib.plan.planner import TIME_PARTS
from course_lib.plan.specs import ClusterSpec, Layout
from course_lib.plan.thresholds import layout_thresholds, threshold_clause

__all__ = ["explain"]

#: the threshold row (estimate.overlap) behind each communication part of the step
_PART_OF = {
    "dp_comm_s": ("DP", "FSDP"),
    "tp_comm_s": ("TP",),
    "bubble_s": ("PP",),
    "p2p_s": ("PP",),
    "cp_comm_s": ("CP",),
    "ep_comm_s": ("EP",),
}


def _family(row: Any) -> str:
    extra = "".join(
        f" x {k.upper()} {row[k]}" for k in ("cp", "ep") if k in row.index and row[k] > 1
    ) + (f" (folded, ETP {row['etp']})" if row.get("etp", 0) else "")
    return f"TP {row['tp']} x PP {row['pp']} x DP {row['dp']}{extra}"


def _largest_part(row: Any) -> str:
    big = max(MEMORY_CATEGORIES, key=lambda k: row[f"{k}_GB"])
    return f"largest part: {big}, {row[big + '_GB']:.1f} GB"


def _nothing_fits(best: Any, usable: float) -> str:
    return (
        f"Nothing fits: the smallest layout, {_family(best)} with ZeRO-{best['zero']} and "
        f"{best['recompute']} recomputation, needs {best['memory_GB']:.1f} GB per GPU "
        f"({_largest_part(best)}) of {usable:.1f} usable. "
        "More GPUs, a smaller batch per GPU, offload, or LoRA instead of full training."
    )


def _winner(top: Any, usable: float) -> list[str]:
    return [
        f"Winner: {_family(top)}, ZeRO-{top['zero']}, {top['recompute']} recomputation, "
        f"micro-batch {top['micro_batch']}"
        + (f", v = {top['v']}" if top["v"] > 1 else "")
        + f": {top['memory_GB']:.1f} GB per GPU of {usable:.1f} usable, step "
        f"{top['step_s']:.2f} s, MFU {top['mfu']:.0%}"
        + (
            f" of the bf16 peak ({top['mfu_fp8_peak']:.0%} of the FP8 peak: FP8 products)."
            if top.get("mfu_fp8_peak", float("nan")) == top.get("mfu_fp8_peak")
            else "."
        ),
        "  Its step: "
        + ", ".join(
            f"{k[:-2].replace('_', ' ')} {top[k] / top['step_s']:.0%}"
            for k in TIME_PARTS
            if top[k] > 0
        )
        + ".",
    ]


def _experts(top: Any, how: Any) -> str:
    """A mixture-of-experts winner's all-to-all, exposed and in all, and its expert products."""
    return (
        f"  Its experts: all-to-all {top['ep_comm_s']:.2f} s exposed of "
        f"{top['ep_all_to_all_s']:.2f} s (schedule {how.ep_schedule}, node limit "
        f"{how.ep_node_limit or 'none'}, capacity factor {how.capacity_factor:g}); expert "
        f"products at {top['expert_gemm_efficiency']:.0%} of the "
        f"{'FP8' if how.fp8 else 'bf16'} peak ({how.matmul_model})."
    )


def _thresholds(row: Any, inputs: dict[str, Any]) -> Any:
    """:func:`layout_thresholds` of a row of plan()'s result."""
    keys = ("dp", "tp", "pp", "zero", "recompute", "micro_batch")
    kw = {k: row[k] for k in keys} | {k: row.get(k, 1) for k in ("cp", "ep")}
    kw["etp"] = row.get("etp", 0)
    lay = Layout(**kw, virtual_stages=row["v"])
    return layout_thresholds(
        inputs["model"],
        inputs["cluster"],
        lay,
        global_batch_tokens=inputs["global_batch_tokens"],
        assumptions=inputs["assumptions"],
    )


def _why_bound(row: Any, inputs: dict[str, Any], parts: tuple[str, ...]) -> str:
    """The threshold clauses (``estimate.overlap``) of the parallelisms behind ``parts``; where
    one part's communication would fit behind compute but the step model overlaps none of it,
    it says so."""
    clauses = []
    table = _thresholds(row, inputs)
    quantity = {"bubble_s": "micro-batches", "p2p_s": "transfer / compute"}
    for part in parts:
        keep = table[table.parallelism.isin(_PART_OF[part])]
        if part in quantity:
            keep = keep[keep.quantity == quantity[part]]
        clauses += [threshold_clause(r) for _, r in keep.iterrows()]
        knob = part.replace("comm_s", "overlap").replace("p2p_s", "p2p_overlap")
        if part != "bubble_s" and keep.hides.all() and not keep.empty:
            if getattr(inputs["assumptions"], knob, 1) == 0:
                clauses[-1] += f", yet the step model overlaps none of it ({knob} = 0)"
    return "; ".join(clauses)


def _slower(row: Any, top: Any, cluster: ClusterSpec) -> tuple[str, str]:
    """Why a family that fits loses: the part of its step that grew most over the winner's."""
    grew = {k: row[k] - top[k] for k in TIME_PARTS}
    cause = max(grew, key=lambda k: grew[k])
    why = {
        "bubble_s": f"pipeline bubble {row['bubble_fraction']:.0%} of the step "
        f"({row['microbatches']} micro-batches on {row['pp']} stages)",
        "tp_comm_s": (
            "tensor parallelism across nodes, over the network"
            if row["tp"] > cluster.gpus_per_node
            else "tensor-parallel all-reduces"
        ),
        "dp_comm_s": f"data-parallel traffic not hidden by backward (ZeRO-{row['zero']})",
        "recompute_s": f"{row['recompute']} recomputation to fit",
        "compute_s": "a slowest stage (the output layer or more layers on it) setting the pace",
        "p2p_s": "stage-to-stage sends",
        "cp_comm_s": f"context-parallel K/V exchanges over {row.get('cp', 1)} ranks",
        "ep_comm_s": f"expert-parallel all-to-alls over {row.get('ep', 1)} ranks",
    }[cause]
    return (
        f"- {_family(row)}: fits, but {row['step_s'] / top['step_s'] - 1:+.0%} "
        f"step time; the main cost: {why} (+{grew[cause]:.2f} s)."
    ), cause


def _no_fit(best: Any, label: str, usable: float) -> str:
    return (
        f"- {label}: doesn't fit; its smallest plan needs {best['memory_GB']:.1f} GB > "
        f"{usable:.1f} ({_largest_part(best)})."
    )


def explain(result: Any, *, families: int = 8) -> str:
    """Why the top plan of :func:`plan` wins, and why each other (tp, pp) family loses: it does
    not fit (its smallest plan and the biggest part of it), or its best plan is slower -- by the
    part of the step that grew most (pipeline bubble, TP over the network or NVLink, DP traffic,
    recomputation, uneven stages). Where that part is communication (or the bubble), it says
    why from the thresholds of ``estimate.overlap`` at the layout's sizes
    (:func:`~course_lib.plan.thresholds.layout_thresholds`): which quantity is below the value
    at which the communication would hide. The winner's line lists its thresholds, met or not."""
    attrs = getattr(result, "attrs", None)
    inputs = attrs.get("inputs") if isinstance(attrs, dict) else None
    if inputs is None or "rejected" not in (attrs or {}):
        raise TypeError(
            f"result = {_v.describe(result) if attrs is None else type(result).__name__}: "
            "expected the DataFrame plan.plan() returned (its attrs hold the inputs)"
        )
    cl, usable = inputs["cluster"], inputs["usable_GB"]
    rejected = result.attrs["rejected"]
    if result.empty:
        return _nothing_fits(rejected.iloc[0], usable)
    top = result.iloc[0]
    lines = _winner(top, usable)
    if top.get("expert_gemm_efficiency", float("nan")) == top.get("expert_gemm_efficiency"):
        lines.append(_experts(top, inputs["assumptions"]))
    comm = tuple(k for k in _PART_OF if top[k] > 0)
    why = _why_bound(top, inputs, comm) if comm else ""
    if why:
        lines.append(f"  Its communication against the thresholds (estimate.overlap): {why}.")
    seen = {(top["tp"], top["pp"])}
    shown = 0
    for _, row in result.groupby(["tp", "pp"], sort=False).head(1).iterrows():
        if (row["tp"], row["pp"]) in seen or shown >= families:
            continue
        seen.add((row["tp"], row["pp"]))
        shown += 1
        line, cause = _slower(row, top, cl)
        why = _why_bound(row, inputs, (cause,)) if cause in _PART_OF else ""
        lines.append(line[:-1] + f": {why}." if why else line)
    if not rejected.empty:
        fitting_zero = set(zip(result["tp"], result["pp"], result["zero"]))
        same = rejected[(rejected.tp == top["tp"]) & (rejected.pp == top["pp"])]
        for zero, grp in same.groupby("zero"):  # the winner's layout with less sharding
            if (top["tp"], top["pp"], zero) not in fitting_zero:
                lines.append(_no_fit(grp.iloc[0], f"{_family(top)} with ZeRO-{zero}", usable))
        for (tp, pp), grp in rejected.groupby(["tp", "pp"], sort=False):
            if (tp, pp) in seen or shown >= families:
                continue
            seen.add((tp, pp))
            shown += 1
            lines.append(_no_fit(grp.iloc[0], _family(grp.iloc[0]), usable))
    return "\n".join(lines)
