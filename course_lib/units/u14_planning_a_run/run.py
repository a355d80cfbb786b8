"""Unit 14's tables (notebooks/14_planning_a_run.ipynb): a run sized on paper.

Everything here is a *prediction* composed from ``course_lib.measure.estimate`` and the planner
(``course_lib.plan``); the checks against reality are the published runs (:func:`published_runs`,
from ``course_lib.plan.published``)
and, in the lecture, the measured runs of units 09-12. :func:`threshold_table`
(``run_thresholds.py``): every overlap threshold of ``estimate.overlap`` at real sizes; what
breaks at scale (failures, checkpoints, restarts, stragglers: ``run_failures.py``). No
matplotlib, no ipywidgets.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from course_lib import plan as P
from course_lib import validate as _v
from course_lib.measure import estimate

__all__ = [
    "BEST_SEARCH",
    "DISAGREEMENTS",
    "NEAR",
    "SHOW_COLUMNS",
    "sources_budget",
    "plan_run",
    "top_plans",
    "published_runs",
    "WHAT_IFS",
    "published_what_ifs",
    "FAMILY_MISSES",
    "published_families",
    "decision_numbers",
    "failures_at_scale",
    "checkpoint_cost",
    "straggler_table",
    "restart_table",
    "plan_problems",
    "PROBLEMS",
    "threshold_table",
]

#: columns of a plan worth showing, in order
SHOW_COLUMNS = [
    "rank",
    "dp",
    "tp",
    "pp",
    "zero",
    "recompute",
    "micro_batch",
    "v",
    "memory_GB",
    "step_s",
    "bubble_fraction",
    "mfu",
    "days",
]

_PEAKS = {"V100": 125e12, "A100": 312e12, "H100": 989e12}  # dense fp16/bf16 tensor FLOP/s


def sources_budget():
    """The sources' budget numbers, recomputed: 6ND for 175B on 300B tokens and the GPUs it needs
    for 30 days at 50 % MFU; 7B on 2T tokens in H100-hours; the MFU Llama-2-7B's reported
    184,320 A100-hours imply. A DataFrame (quantity, value, unit, how)."""
    import pandas as pd

    f175 = estimate.training_flops_per_token(175 * 10**9) * 300 * 10**9
    rows = [("FLOPs, 175B x 300B tokens", f175, "FLOP", "6 N D")]
    rows += [
        (
            f"{g} for 30 days at 50 % MFU",
            estimate.gpus_for_days(f175, days=30, peak_flops=p, mfu=0.5),
            "GPUs",
            f"{p / 1e12:.0f} TFLOP/s peak",
        )
        for g, p in _PEAKS.items()
    ]
    f7 = estimate.training_flops_per_token(7 * 10**9) * 2 * 10**12
    rows.append(("FLOPs, 7B x 2T tokens", f7, "FLOP", "6 N D"))
    rows.append(
        (
            "H100-hours at 50 % MFU",
            estimate.gpu_hours(f7, peak_flops=_PEAKS["H100"], mfu=0.5),
            "hours",
            "F / (0.5 x 989 TFLOP/s)",
        )
    )
    n7 = P.model("Llama-2-7B").n_params
    rows.append(
        (
            "Llama-2-7B: MFU implied by 184,320 A100-hours",
            estimate.mfu_from_gpu_hours(
                estimate.training_flops_per_token(n7) * 2 * 10**12,
                184_320,
                peak_flops=_PEAKS["A100"],
            ),
            "fraction",
            "6 x 6.74e9 x 2e12 / (hours x 312 TFLOP/s)",
        )
    )
    rows.append(
        (
            "175B model state at 16 B/param",
            estimate.model_state_bytes(175 * 10**9, precision="bf16-mixed")["total"],
            "bytes",
            "2 + 2 + 4 + 4 + 4",
        )
    )
    rows.append(("80 GB GPUs to hold it", math.ceil(16 * 175e9 / 80e9), "GPUs", "2.8 TB / 80 GB"))
    return pd.DataFrame(rows, columns=["quantity", "value", "unit", "how"])


def plan_run(
    model,
    cluster: str = "8xH100 + 400G IB",
    *,
    gpus: int | None = None,
    global_batch_tokens: int = 4 * 2**20,
    total_tokens: float | None = 2e12,
    **kwargs,
):
    """``course_lib.plan.plan`` for a model (a preset name or a ModelSpec) on ``gpus`` GPUs of a
    cluster preset (or "this machine")."""
    spec = P.model(model) if isinstance(model, str) else model
    cl = P.cluster(cluster, gpus=gpus)
    return P.plan(
        spec, cl, global_batch_tokens=global_batch_tokens, total_tokens=total_tokens, **kwargs
    )


def top_plans(result, n: int = 8):
    """The first ``n`` rows of a plan, with the columns worth reading (cp and ep where some
    plan uses them), rounded."""
    cols = [c for c in SHOW_COLUMNS if c in result.columns]
    at = cols.index("pp") + 1 if "pp" in cols else len(cols)
    cols[at:at] = [c for c in ("cp", "ep") if c in result.columns and (result[c] > 1).any()]
    out = result[cols].head(_v.count("n", n, minimum=1)).copy()
    for c, d in {"memory_GB": 1, "step_s": 2, "bubble_fraction": 3, "mfu": 3, "days": 1}.items():
        if c in out:
            out[c] = out[c].round(d)
    return out.reset_index(drop=True)


#: published runs that fit but that the planner ranks more than a few percent (NEAR) behind its
#: own best, and who is right; the lecture's section 2.3 says the same
NEAR = 0.05
DISAGREEMENTS: dict[str, str] = {
    "Llama 3 405B, 8K, 16,384 GPUs": "the same layout: the planner's best interleaves 8 "
    "virtual stages where this row assumes 4 (Table 4 does not give v). Nobody is wrong",
    "BLOOM-176B": "the planner drops the full recomputation (and deepens data parallelism). "
    "The team is right: their stack had no selective recomputation (Korthikanti et al. 2022 "
    "came later), and the planner under-counts their memory (about 44 of the 60 GB BLOOM "
    "reported), so its plan without recomputation, at 75 of 76 GB, would not have fit",
    "MT-NLG 530B": "the planner recomputes only attention and runs a 7-stage pipeline; in 2021 "
    "selective recomputation did not exist, and without it PP 7 does not fit",
    "OPT-175B": "the planner recomputes selectively at TP 4; OPT's stack (2021-22) recomputed "
    "whole layers, and its 147 TFLOP/s is a best stretch, not the mean",
}


def _best(run: Any, only: dict[str, Any]) -> dict[str, str | float]:
    result = plan_published_run(run, only)
    top = result.iloc[0]
    dims = f"DP{top.dp} TP{top.tp} PP{top.pp}" + "".join(
        f" {k.upper()}{top[k]}" for k in ("cp", "ep") if top[k] > 1
    )
    return {
        "planner's best": f"{dims}, ZeRO-{top.zero}, {top.recompute}, mb {top.micro_batch}, "
        f"v {top.v}",
        "best step_s": top.step_s,
        "best MFU": top.mfu,
    }


def published_runs(best: bool = True):
    """The published runs as published (``plan.published.published_table``: layout,
    recomputation, micro-batch, sequence and batch as the papers give them), the planner's
    step time and MFU beside the reported ones and the residual; with ``best``, the planner's
    own best plan for the same model, GPUs and batch (searched as :data:`BEST_SEARCH` says) and
    how much slower the published layout is by the planner's clock. A DataFrame, one row per
    run."""
    from course_lib.plan import published

    out = published.published_table()
    if best:
        rows = [
            _best(published.RUNS[name], BEST_SEARCH[name]) if name in BEST_SEARCH else {}
            for name in out["run"]
        ]
        import pandas as pd

        out = pd.concat([out, pd.DataFrame(rows)], axis=1)
        out["published vs best"] = out["predicted step_s"] / out["best step_s"] - 1
    return out


def decision_numbers() -> dict[str, float]:
    """The numbers behind the lecture's decision guide, each from ``estimate`` or the planner
    (bytes are GB = 1e9, times seconds)."""
    h100 = P.cluster("8xH100 + 400G IB")
    out = {}
    # DP alone: the largest model whose 16 B/param state fits in 80 GB with nothing else
    out["dp_alone_max_params_B"] = h100.memory_bytes / 16 / 1e9
    # ZeRO: 7B on 8 GPUs (S4's 112 / 38.5 / 26.25 / 14 GB)
    for stage in range(4):
        out[f"zero{stage}_7b_on_8_GB"] = (
            estimate.zero_bytes_per_rank(7 * 10**9, stage=stage, world_size=8) / 1e9
        )
    # TP: the share of a GPT-3 175B step spent in TP all-reduces, TP 8 in a node vs TP 16
    # across two (GPT-3's batch: 1,536 sequences of 2,048 tokens)
    m70 = P.model("Llama-2-70B")
    c64 = P.cluster("8xH100 + 400G IB", gpus=64)
    for tp in (8, 16):
        t = P.step_time(
            P.model("GPT-3-175B"),
            c64,
            P.Layout(64 // tp, tp, 1, 1, "selective", 1),
            global_batch_tokens=1536 * 2048,
        )
        out[f"tp{tp}_comm_share"] = t["tp_comm_s"] / t["step_s"]
    # PP: bubble with m = 4 p at p = 8 (S2's rule of thumb), and the bytes a stage boundary
    # carries per micro-batch beside the gradients a DP replica all-reduces (70B, bf16)
    out["bubble_p8_m32"] = estimate.pipeline_bubble_fraction(8, 32)
    out["boundary_70b_GB"] = estimate.pipeline_boundary_bytes(1, 4096, 8192) / 1e9
    out["grads_70b_GB"] = 2 * m70.n_params / 1e9  # reduced in bf16
    out["grads_70b_fp32_GB"] = estimate.dtype_bytes("fp32") * m70.n_params / 1e9  # reduced in fp32
    # offload: 7B moves 14 GB each way per step over PCIe 4.0 (about 32 GB/s)
    out["offload_7b_s"] = 2 * 7e9 / (estimate.link_speed("PCIe 4.0 x16").per_direction_GBps * 1e9)
    # LoRA: 70B full training state vs a frozen bf16 base + rank-16 adapters on q, v
    lora = estimate.transformer_lora_params(hidden=8192, ffn=28672, layers=80, r=16)
    out["full_70b_state_GB"] = (
        estimate.model_state_bytes(m70.n_params, precision="bf16-mixed")["total"] / 1e9
    )
    out["lora_70b_state_GB"] = (
        estimate.finetune_state_bytes(m70.n_params, method="lora", lora_params=lora)["total"] / 1e9
    )
    out["node_memory_GB"] = 8 * h100.memory_bytes / 1e9
    out |= _cp_ep_numbers()
    return out


def _cp_ep_numbers() -> dict[str, float]:
    """CP: one Llama 3 405B layer's activations per GPU at 128K tokens (TP 8, sequence
    parallel, FlashAttention), the sequence whole or split 16 ways (unit 15's count). EP:
    DeepSeek-V3's model state per GPU as it ran (PP 16, DP 128, ZeRO-1) with the experts whole
    or split 64 ways, and the share of its step the all-to-alls would take if nothing hid them
    (unit 16's bytes)."""
    from course_lib.plan import published

    m = P.model("Llama-3-405B")
    out = {}
    for cp in (1, 16):
        out[f"act_128k_cp{cp}_GB"] = (
            estimate.cp_activation_bytes_per_layer(
                131072,
                1,
                m.hidden,
                m.heads,
                cp=cp,
                kv_heads=m.kv_heads,
                ffn=m.ffn,
                gated_mlp=True,
                tp=8,
                sequence_parallel=True,
            )  # fmt: skip
            / 1e9
        )
    ds = published.RUNS["DeepSeek-V3"]
    for ep in (1, 64):
        lay = dataclasses.replace(ds.layout, ep=ep)
        mem = P.predict_memory(ds.model, lay, global_batch_tokens=ds.global_batch_tokens,
                               uneven_stages=True)  # fmt: skip
        out[f"deepseek_state_ep{ep}_GB"] = (
            sum(mem[k] for k in ("params", "grads", "optimizer")) / 1e9
        )
    exposed = P.step_time(
        ds.model, P.cluster(ds.cluster, gpus=ds.gpus), ds.layout,
        global_batch_tokens=ds.global_batch_tokens, uneven_stages=True,
        assumptions=ds.assumptions.replace(ep_overlap=0.0, ep_schedule="none"),
    )  # fmt: skip
    out["deepseek_a2a_share_unhidden"] = exposed["ep_comm_s"] / exposed["step_s"]
    return out


#: the problems :func:`plan_problems` names
PROBLEMS = ("tp_across_nodes", "fewer_microbatches_than_stages", "batch_not_divisible")


def plan_problems(model, cluster, layout, global_batch_tokens: int) -> set[str]:
    """What is wrong with a layout (the course's answer to exercise task 2), as names from
    :data:`PROBLEMS`: tensor parallelism wider than a node; fewer micro-batches than pipeline
    stages (the pipeline never fills); a global batch that does not split into dp x micro_batch
    whole sequences."""
    found = set()
    if layout.tp > cluster.gpus_per_node:
        found.add("tp_across_nodes")
    seqs, rest = divmod(global_batch_tokens, model.seq)
    per = layout.dp * layout.micro_batch
    if rest or seqs % per:
        found.add("batch_not_divisible")
    elif seqs // per < layout.pp:
        found.add("fewer_microbatches_than_stages")
    return found


from course_lib.units.u14_planning_a_run.run_failures import (  # noqa: E402
    checkpoint_cost,
    failures_at_scale,
    restart_table,
    straggler_table,
)
from course_lib.units.u14_planning_a_run.run_published import (  # noqa: E402
    BEST_SEARCH,
    FAMILY_MISSES,
    WHAT_IFS,
    plan_published_run,
    published_families,
    published_what_ifs,
)
from course_lib.units.u14_planning_a_run.run_thresholds import threshold_table  # noqa: E402
