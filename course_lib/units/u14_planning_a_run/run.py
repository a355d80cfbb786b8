"""Unit 14's tables (notebooks/14_planning_a_run.ipynb): a run sized on paper.

Everything here is a *prediction* composed from ``course_lib.measure.estimate`` and the planner
(``course_lib.plan``); the checks against reality are the published runs (:func:`published_runs`)
and, in the lecture, the measured runs of units 09-12. No matplotlib, no ipywidgets.
"""

from __future__ import annotations

import math
from typing import Any

from course_lib import plan as P
from course_lib import validate as _v
from course_lib.measure import estimate

__all__ = [
    "PUBLISHED",
    "SHOW_COLUMNS",
    "sources_budget",
    "plan_run",
    "top_plans",
    "published_runs",
    "reported_mfu",
    "decision_numbers",
    "failures_at_scale",
    "checkpoint_cost",
    "straggler_table",
    "plan_problems",
    "PROBLEMS",
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

#: published layouts: model, cluster, GPUs, global batch (tokens), (dp, tp, pp), ZeRO stage and
#: recomputation as run (None: the planner's choice), and what the paper printed about speed,
#: in the metric it printed: "mfu" (model FLOPs, the PaLM count), "hardware_tflops" (per GPU,
#: recomputation counted) or "step_s" (seconds per step, from which MFU is counted here).
PUBLISHED: dict[str, dict[str, Any]] = {
    "Llama-3-405B": dict(
        cluster="8xH100 + 400G IB",
        gpus=16384,
        batch=16 * 2**20,
        layout=(128, 8, 16),
        zero=None,
        recompute=None,
        uneven=True,
        printed={"mfu": 0.41},
        source="Llama Team 2024, arXiv:2407.21783, Table 4: 400 TFLOP/s per "
        "GPU, 41 % BF16 MFU at 16K GPUs (38-43 % over their runs)",
    ),
    "BLOOM-176B": dict(
        cluster="8xA100-80GB + 200G IB",
        gpus=384,
        batch=2048 * 2048,
        layout=(8, 4, 12),
        zero=1,
        recompute="full",
        uneven=True,
        printed={"hardware_tflops": 150.0},
        source="BigScience 2022, arXiv:2211.05100 Sec. 3.4: ZeRO-1, full activation "
        "checkpointing, about 150 TFLOP/s per GPU counting the recomputation; 60 GB per GPU",
    ),
    "MT-NLG-530B": dict(
        cluster="8xA100-80GB + 200G IB",
        gpus=2240,
        batch=1920 * 2048,
        layout=(8, 8, 35),
        zero=None,
        recompute="full",
        uneven=False,
        printed={"hardware_tflops": 126.0, "step_s": 60.1},
        source="Smith et al. 2022, arXiv:2201.11990 Sec. 2.4: 126 TFLOP/s per "
        "GPU counting the recomputation, 60.1 s per step at 2,240 GPUs",
    ),
}


def reported_mfu(name: str) -> dict[str, float | str]:
    """What a published run printed about its speed, and its MFU counted the PaLM way
    (``ModelSpec.flops_per_token``): from its step time where it printed one (model FLOPs per
    step / (step x GPUs x peak)), else from a hardware rate (x model / hardware FLOPs of the
    recomputation it ran), else its printed MFU. Never an HFU called MFU: BLOOM's and MT-NLG's
    TFLOP/s count their full recomputation."""
    run = PUBLISHED[_v.choice("name", name, tuple(PUBLISHED))]
    spec, cl = P.model(name), P.cluster(run["cluster"], gpus=run["gpus"])
    model_f, hardware_f = spec.flops_per_token(run["recompute"] or "none")
    printed = run["printed"]
    if "step_s" in printed:
        mfu = run["batch"] * model_f / (printed["step_s"] * run["gpus"] * cl.peak_flops)
        how = f"from {printed['step_s']} s per step"
    elif "hardware_tflops" in printed:
        mfu = printed["hardware_tflops"] * 1e12 * model_f / hardware_f / cl.peak_flops
        how = f"from {printed['hardware_tflops']:g} TFLOP/s x model / hardware FLOPs"
    else:
        mfu, how = printed["mfu"], "as printed"
    shown = (
        f"{printed['hardware_tflops']:g} TFLOP/s/GPU incl. recompute (HFU "
        f"{printed['hardware_tflops'] * 1e12 / cl.peak_flops:.2f})"
        if "hardware_tflops" in printed
        else f"MFU {printed['mfu']:.2f}"
    )
    return {"printed": shown, "reported MFU": mfu, "counted": how}


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
    """The first ``n`` rows of a plan, with the columns worth reading, rounded."""
    cols = [c for c in SHOW_COLUMNS if c in result.columns]
    out = result[cols].head(_v.count("n", n, minimum=1)).copy()
    for c, d in {"memory_GB": 1, "step_s": 2, "bubble_fraction": 3, "mfu": 3, "days": 1}.items():
        if c in out:
            out[c] = out[c].round(d)
    return out.reset_index(drop=True)


def published_runs():
    """Each published layout beside the planner, run as published (its layout, ZeRO stage and
    recomputation): does it fit, its memory per GPU, where it ranks, how far its step time is
    from the planner's best, and its predicted MFU and HFU beside what the paper printed and the
    MFU that counts (``reported_mfu``). A DataFrame, one row per run."""
    import pandas as pd

    rows = []
    for name, run in PUBLISHED.items():
        result = plan_run(
            name,
            run["cluster"],
            gpus=run["gpus"],
            global_batch_tokens=run["batch"],
            total_tokens=None,
            uneven_stages=run["uneven"],
        )
        dp, tp, pp = run["layout"]
        mine = result[(result.dp == dp) & (result.tp == tp) & (result.pp == pp)]
        for key in ("zero", "recompute"):
            if run[key] is not None:
                mine = mine[mine[key] == run[key]]
        best = None if mine.empty else mine.iloc[0]
        row = {"run": name, "GPUs": run["gpus"], "layout (DP x TP x PP)": f"{dp} x {tp} x {pp}"}
        row |= {"fits": best is not None, "plans that fit": len(result)}
        if best is not None:
            row |= {
                "rank": int(best["rank"]),
                "vs best step": best["step_s"] / result.iloc[0]["step_s"] - 1,
                "memory_GB": best["memory_GB"],
                "chosen": f"ZeRO-{best['zero']}, {best['recompute']}, "
                f"mb {best['micro_batch']}, v {best['v']}",
                "predicted step_s": best["step_s"],
                "predicted HFU": best["hfu"],
                "predicted MFU": best["mfu"],
            }
        rows.append(row | reported_mfu(name) | {"source": run["source"]})
    out = pd.DataFrame(rows)
    out["MFU gap (points)"] = 100 * (out["predicted MFU"] - out["reported MFU"])
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
    return out


# Llama 3 405B pre-training (Llama Team 2024, arXiv:2407.21783, Sec. 3.3.4 and Table 5): 466
# interruptions in a 54-day snapshot on 16,384 H100s, 419 of them unexpected; about 78 % of the
# unexpected ones confirmed or suspected hardware; storage 2 TB/s sustained, 7 TB/s peak.
LLAMA3_UNEXPECTED, LLAMA3_DAYS, LLAMA3_GPUS = 419, 54, 16384


def failures_at_scale(gpus=(8, 64, 512, 2048, 16384), *, days: float = 54):
    """Unexpected interruptions per day and the mean time between them for a job on ``gpus``
    GPUs, scaling Llama 3's 419 in 54 days at 16,384 GPUs by the GPU count (each GPU fails
    independently at the same rate), and how many a ``days``-long run meets."""
    import pandas as pd

    per_gpu_day = LLAMA3_UNEXPECTED / (LLAMA3_DAYS * LLAMA3_GPUS)
    rows = []
    for n in gpus:
        per_day = per_gpu_day * _v.count("gpus", n, minimum=1)
        rows.append(
            {
                "GPUs": n,
                "failures per day": per_day,
                "hours between failures": 24 / per_day,
                f"failures in {days:g} days": per_day * days,
            }
        )
    return pd.DataFrame(rows)


def checkpoint_cost(
    model: str = "Llama-3-405B", *, write_GBps: float = 2000.0, mtbf_hours: float | None = None
) -> dict[str, float]:
    """A full checkpoint's size (bf16 weights + fp32 master + Adam: 2 + 12 B/param), its write
    time at ``write_GBps`` (Llama 3's storage sustains 2 TB/s), Young's optimal interval
    sqrt(2 delta M) between checkpoints (Young 1974, CACM 17(9)) for the mean time between
    failures M (default: Llama 3's, 54 days x 24 h / 419), and the fraction of time lost to
    writing plus redoing half an interval after each failure."""
    spec = P.model(model)
    size = (2 + 12) * spec.n_params
    write_s = size / (_v.number("write_GBps", write_GBps, positive=True) * 1e9)
    mtbf = (LLAMA3_DAYS * 24 / LLAMA3_UNEXPECTED if mtbf_hours is None else mtbf_hours) * 3600
    interval = math.sqrt(2 * write_s * mtbf)
    return {
        "size_TB": size / 1e12,
        "weights_TB": 2 * spec.n_params / 1e12,
        "write_s": write_s,
        "mtbf_h": mtbf / 3600,
        "interval_min": interval / 60,
        "lost_fraction": write_s / interval + interval / (2 * mtbf),
    }


def straggler_table(gpus=(8, 512, 16384), *, p_slow: float = 1e-5, slowdown: float = 2.0):
    """A synchronous step waits for its slowest GPU. If each GPU is independently slow (by
    ``slowdown``x) in a step with probability ``p_slow``, a step is slow with probability
    1 - (1 - p)^N, and the mean step costs 1 + (slowdown - 1) times that. A model, not a
    measurement: it shows why a rare hiccup per GPU becomes a steady tax at 16K GPUs."""
    import pandas as pd

    p = _v.number("p_slow", p_slow, minimum=0, maximum=1)
    rows = []
    for n in gpus:
        slow = 1 - (1 - p) ** _v.count("gpus", n, minimum=1)
        rows.append(
            {"GPUs": n, "P(step is slow)": slow, "mean step / ideal": 1 + (slowdown - 1) * slow}
        )
    return pd.DataFrame(rows)


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
    seqs, rest = divmod(global_batch_tokens, model.seq_len)
    per = layout.dp * layout.micro_batch
    if rest or seqs % per:
        found.add("batch_not_divisible")
    elif seqs // per < layout.pp:
        found.add("fewer_microbatches_than_stages")
    return found
