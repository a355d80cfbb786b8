"""``python -m course_tools.bench virtual``: the virtual cluster against the ZeRO numbers, and how
fast it simulates a 70B model on 512 ranks.

1. Figure 1 of the ZeRO paper (7.5B params, 64 GPUs, 16 B/param): target, estimate
   (``estimate.zero_bytes_per_rank``) and FSDP2 on the virtual cluster, with the ratio to the
   target and the residual of each row explained (see ``course_lib/virtual/zero.py``).
2. 7B at 16 B/param on 8 GPUs (112 / 38.5 / 26.25 / 14 GB): the same three ways.
3. Performance: one AdamW step of a Llama-2-70B-shaped model fully sharded over 512 virtual
   ranks (targets on 2 cores: <= 30 s, <= 1 GiB resident memory).

Seconds are wall-clock on this machine and CPU seconds of the simulating process (on a shared
machine the CPU seconds are the steadier number); the header prints the load average.
Introduced in notebooks/10_zero_fsdp.ipynb.
"""

from __future__ import annotations

import os
import time
from typing import TypedDict

import pandas as pd

from course_lib.virtual.model import PRESETS
from course_lib.virtual.result import SimulatedStep
from course_lib.virtual.simulate import simulate_step
from course_lib.virtual.zero import ZeroTable, zero_7b_table, zero_figure1

__all__ = ["format_zero_table", "bench_70b", "run"]

TARGET_S = 30.0
TARGET_RSS = 2**30


def format_zero_table(table: ZeroTable) -> str:
    """The ZeRO table as aligned text: GB per rank (1e9 B), ratio to the target, and the note.

    states = params + grads + optim (the shards); virtual = states + gathered (the bf16
    parameters gathered at once); ratio = virtual / target; resid. = virtual - estimate at the
    model's exact parameter count; peak = the rank's whole peak (activations, buffers too).
    """

    def gb(x: float | None) -> str:
        return "-" if x is None or pd.isna(x) else f"{x:.3f}"

    header = (
        "stage",
        "target",
        "estimate",
        "est@model",
        "FSDP2 run",
        "params",
        "grads",
        "optim",
        "states",
        "gathered",
        "virtual",
        "ratio",
        "resid.",
        "peak",
        "why",
    )
    lines = [header]
    for r in table.to_frame().to_dict("records"):
        lines.append(
            (
                r["name"],
                gb(r["target_GB"]),
                gb(r["estimate_GB"]),
                gb(r["estimate_model_GB"]),
                r["strategy"] if isinstance(r["strategy"], str) else "-",
                gb(r.get("params_GB")),
                gb(r.get("grads_GB")),
                gb(r.get("optimizer_GB")),
                gb(r.get("states_GB")),
                gb(r.get("gathered_GB")),
                gb(r.get("virtual_GB")),
                "-" if pd.isna(r.get("ratio")) else f"{r['ratio']:.3f}",
                gb(r.get("residual_GB")),
                gb(r.get("peak_GB")),
                r["note"],
            )
        )
    widths = [max(len(str(line[i])) for line in lines) for i in range(len(header) - 1)]
    out = []
    for line in lines:
        cells = [str(c).ljust(w) for c, w in zip(line[:-1], widths)]
        out.append("  ".join(cells) + "  " + line[-1])
    out.insert(1, "-" * len(out[0]))
    return "\n".join(out)


def _legend(table: ZeroTable) -> str:
    cpu = [step.simulate_s for step in table.runs.values()]
    return (
        "states = params + grads + optim (fp32 shards, Adam moments); virtual = states + "
        "gathered bf16 params alive at once; ratio = virtual / target; resid. = virtual - "
        "estimate at the model's exact count (an upper bound: for ddp the bf16 copy is freed "
        "before the last gradients exist, so its peak is lower); peak = the rank's whole "
        "peak in forward + backward, activations and buffers included. "
        f"Simulations: {len(cpu)}, {sum(cpu):.0f} CPU s. See course_lib/virtual/zero.py."
    )


class Bench70B(TypedDict):
    """What :func:`bench_70b` measured: the simulated step, wall and simulating seconds, peak RSS."""

    step: SimulatedStep
    wall_s: float
    cpu_s: float
    rss: int


def bench_70b(world_size: int = 512, seq: int = 4096) -> Bench70B:
    """One FSDP2 step of Llama-2-70B (bf16 compute, fp32 master + AdamW) on the virtual cluster."""
    t0 = time.perf_counter()
    step = simulate_step(
        PRESETS["llama2-70b"],
        world_size=world_size,
        strategy="fsdp",
        mixed_precision="bf16",
        batch=1,
        seq=seq,
        count_comm=False,
        timeout=600,
    )
    wall = time.perf_counter() - t0
    return {"step": step, "wall_s": wall, "cpu_s": step.simulate_s, "rss": step.rss_peak_bytes}


def _print_70b() -> None:
    """Part 3: Llama-2-70B on 512 virtual ranks, against the time and memory targets."""
    r = bench_70b()
    step = r["step"]
    n = PRESETS["llama2-70b"].n_params
    ok_t = "met" if r["wall_s"] <= TARGET_S else "NOT met"
    ok_m = "met" if r["rss"] <= TARGET_RSS else "NOT met"
    print(
        f"\n3. Llama-2-70B ({n:,} params), FSDP2 over 512 virtual ranks, bf16 + fp32 "
        "AdamW, batch 1 x 4096 tokens per rank: the same run would need 512 GPUs."
    )
    print(
        f"   here: {r['wall_s']:.1f} s wall (target <= {TARGET_S:.0f} s {ok_t}), "
        f"{r['cpu_s']:.1f} CPU s in the simulating process, peak RSS "
        f"{r['rss'] / 2**30:.2f} GiB (target <= 1 GiB {ok_m})"
    )
    print(
        f"   per rank (virtual): params {step.at('params', 'after_backward') / 1e9:.3f} GB, "
        f"grads {step.at('grads', 'after_backward') / 1e9:.3f} GB, optimizer "
        f"{step.at('optimizer', 'after_step') / 1e9:.3f} GB, peak "
        f"{step.at('total', 'at_peak') / 1e9:.2f} GB (activations at the peak "
        f"{step.at('activations', 'at_peak') / 1e9:.2f} GB); 16 B x {n:,} / 512 = "
        f"{16 * n / 512 / 1e9:.3f} GB of model states"
    )


def run(*, figure1: bool = True, seven_b: bool = True, seventy_b: bool = True) -> int:
    load = " ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"
    print(
        f"virtual cluster: fake process group + FakeTensorMode + FSDPMemTracker; "
        f"{os.cpu_count()} logical CPUs, load average {load}. Every 'virtual' number is "
        "simulated (PyTorch's real sharding code, no GPU); GB = 1e9 B."
    )
    if figure1:
        t0 = time.perf_counter()
        table = zero_figure1(count_comm=False)
        print(
            f"\n1. ZeRO Figure 1 (arXiv:1910.02054): 7.5B params, 64 ranks, per rank "
            f"[{table.model}: {table.n_params:,} params; "
            f"{time.perf_counter() - t0:.0f} s]"
        )
        print(format_zero_table(table))
        print(_legend(table))
    if seven_b:
        t0 = time.perf_counter()
        table = zero_7b_table(count_comm=False)
        print(
            f"\n2. 7B at 16 B/param on 8 ranks (targets 112 / 38.5 / 26.25 / 14 GB) "
            f"[{table.model}: {table.n_params:,} params; "
            f"{time.perf_counter() - t0:.0f} s]"
        )
        print(format_zero_table(table))
        print(_legend(table))
    if seventy_b:
        _print_70b()
    return 0
