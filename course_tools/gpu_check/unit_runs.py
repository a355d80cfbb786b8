"""Part a: the run functions of units 01-07 that take a ``device``, on that device, small.

Units 04, 06 and 07 have none (their runs are CPU, meta-device or virtual-cluster only). Each
check calls the unit's public ``run`` module the way its lecture does (``unit.run.x``) and
keeps a few figures of what came back. Sizes are small on the CPU (the test runs them on 2
cores) and larger on a GPU, where a 32-wide matmul would measure only the launch overhead.

The units are loaded by name, as ``course_lib.cluster`` finds them: this tool stands where a
notebook stands, above the units, not in a mechanism layer under them.
"""

from __future__ import annotations

import importlib
import math
from types import ModuleType

import pandas as pd
import torch

from course_lib.models import GPT, MLP, GPTConfig, MLPConfig
from course_tools.gpu_check.core import Figure, Outcome, Settings, failed

MiB = 2**20

#: the units this part calls, by package name
UNITS = {
    "u01": "u01_backprop_memory",
    "u02": "u02_batch_size_and_accumulation",
    "u03": "u03_mixed_precision",
    "u05": "u05_cpu_offload",
}


def unit_run(unit: str) -> ModuleType:
    """``course_lib.units.<unit>.run``, as a notebook's ``unit.run``."""
    return importlib.import_module(f"course_lib.units.{UNITS[unit]}.run")


def _big(settings: Settings) -> bool:
    return settings.device == "cuda"


def _mlp() -> MLP:
    torch.manual_seed(0)
    return MLP(MLPConfig(in_features=64, hidden=(256, 256), out_features=10))


def _mib(nbytes: float) -> float:
    return round(float(nbytes) / MiB, 3)


# --------------------------------------------------------------------------------------------
# unit 01
# --------------------------------------------------------------------------------------------
def u01_allocator_demo(settings: Settings) -> Outcome:
    """Allocated vs reserved bytes; the lecture's claim: a freed block stays reserved."""
    nbytes = 64 * MiB
    df = unit_run("u01").allocator_demo(nbytes, device=settings.device)
    figures: dict[str, Figure] = {
        f"{row.event}: allocated / reserved (MiB)": f"{_mib(row.allocated)} / {_mib(row.reserved)}"
        for row in df.itertuples()
    }
    freed, emptied = df.iloc[2], df.iloc[4]
    if freed["reserved"] < nbytes or freed["allocated"] >= df.iloc[1]["allocated"]:
        return failed("after del the block was not kept reserved (or not freed)", figures)
    if emptied["reserved"] >= freed["reserved"]:
        return failed("empty_cache() did not hand the block back", figures)
    return Outcome(figures)


def u01_compare_step_memory(settings: Settings) -> Outcome:
    """Predicted vs measured bytes per category of one step, for an MLP and the tiny GPT."""
    run = unit_run("u01")
    torch.manual_seed(0)
    models = {"MLP": (_mlp(), (64,)), "GPT": (GPT(GPTConfig.tiny()), (4, 32))}
    figures: dict[str, Figure] = {}
    for label, (model, shape) in models.items():
        df = run.compare_step_memory(model, shape, "adam", device=settings.device)
        rows = df.set_index("category")
        for category in ("params", "activations"):
            figures[f"{label} {category} predicted / measured (B)"] = (
                f"{int(rows.loc[category, 'predicted']):,} / {int(rows.loc[category, 'measured']):,}"
            )
    return Outcome(figures)


# --------------------------------------------------------------------------------------------
# unit 02
# --------------------------------------------------------------------------------------------
def u02_roofline(settings: Settings) -> Outcome:
    """The roofline of the device: matmul FLOP/s, copy bandwidth, and ops placed on it."""
    sizes = (256, 1024, 4096) if _big(settings) else (32, 128)
    numel = 2**24 if _big(settings) else 2**16
    ops, machine = unit_run("u02").roofline_ops(
        matmul_sizes=sizes, elementwise_numel=numel, device=settings.device, warmup=1, repeat=3
    )
    return Outcome(
        {
            "peak (TFLOP/s)": round(machine["peak_flop_per_s"] / 1e12, 4),
            "peak from": machine["peak_source"],
            "copy bandwidth (GB/s)": round(machine["bandwidth_bytes_per_s"] / 1e9, 2),
            "ridge (FLOP/B)": round(machine["ridge_flop_per_byte"], 2),
            "ops timed": len(ops),
        }
    )


def u02_step_and_throughput(settings: Settings) -> Outcome:
    """One step's measured peak (with the allocator's reserved peak on CUDA), and samples/s."""
    run = unit_run("u02")
    peak = run.step_peak_bytes(_mlp(), 256, device=settings.device)
    figures: dict[str, Figure] = {
        "step peak, batch 256 (MiB)": _mib(peak["peak_bytes"]),
        "peak phase": peak["peak_phase"],
    }
    if "cuda_peak_reserved" in peak:
        figures["allocator reserved peak (MiB)"] = _mib(peak["cuda_peak_reserved"])
    df = run.throughput_vs_batch(_mlp(), (32, 256), device=settings.device, warmup=1, repeat=3)
    for row in df.itertuples():
        figures[f"samples/s at batch {row.batch}"] = round(float(row.samples_per_s), 1)
    return Outcome(figures)


def u02_largest_batch(settings: Settings) -> Outcome:
    """The largest batch under a simulated budget, each probe a real step on the device.

    On CUDA the probes compare the allocator's reserved peak too, which starts at what the
    caching allocator already holds (cuBLAS's workspace among it): hence a larger budget there.
    """
    run = unit_run("u02")
    budget_bytes, multiple = (256 * MiB, 256) if _big(settings) else (4 * MiB, 32)
    found = run.largest_batch_that_fits(
        _mlp(),
        run.MemoryBudget(budget_bytes, simulated=True),
        device=settings.device,
        multiple_of=multiple,
        max_batch=2**16,
    )
    figures: dict[str, Figure] = {
        "budget (MiB)": _mib(budget_bytes),
        "largest batch": found["batch"],
        "its peak (MiB)": _mib(found["peak_bytes"] or 0),
        "probes": len(found["probes"]),
    }
    if found["batch"] == 0:
        return failed(f"not even a batch of {multiple} fits the budget", figures)
    return Outcome(figures)


def u02_accumulation(settings: Settings) -> Outcome:
    """Accumulated vs full-batch step: the peak at 1 and 4 micro-batches (timed too)."""
    df = unit_run("u02").accumulation_memory_and_time(
        _mlp(), 32, (1, 4), device=settings.device, warmup=1, repeat=2
    )
    figures: dict[str, Figure] = {}
    for row in df.itertuples():
        key = f"k={row.accumulation_steps} {row.mode}"
        figures[f"{key}: peak (MiB)"] = _mib(row.peak_bytes)
    return Outcome(figures)


def u02_gpt_mfu(settings: Settings) -> Outcome:
    """Matmul throughput as the peak, then the MFU of a tiny GPT step against it."""
    run = unit_run("u02")
    n = 4096 if _big(settings) else 256
    peak = run.measure_matmul_throughput(n, device=settings.device, warmup=1, repeat=3)
    mfu = run.gpt_step_mfu(
        GPTConfig.tiny(), 8, peak["flop_per_s"], device=settings.device, warmup=1, repeat=3
    )
    return Outcome(
        {
            f"matmul {n}^3 (TFLOP/s)": round(peak["flop_per_s"] / 1e12, 4),
            "tiny GPT step (s)": round(mfu["median_s"], 5),
            "MFU": round(mfu["mfu"], 4),
        }
    )


# --------------------------------------------------------------------------------------------
# unit 03
# --------------------------------------------------------------------------------------------
def u03_training_memory(settings: Settings) -> Outcome:
    """One Adam step of the tiny GPT in every precision recipe: measured vs predicted peak."""
    df = unit_run("u03").training_memory(batch=4, seq=32, device=settings.device)
    peaks = df[df["category"] == "peak"]
    return Outcome(
        {
            f"{row.mode} peak measured / predicted (B)": f"{row.measured:,} / {row.predicted:,}"
            for row in peaks.itertuples()
        }
    )


def u03_matmul_speed(settings: Settings) -> Outcome:
    """Matmul GFLOP/s per dtype (fp32, bf16, fp16)."""
    sizes = (1024, 4096) if _big(settings) else (128,)
    df = unit_run("u03").matmul_speed(sizes, warmup=1, repeat=3, device=settings.device)
    return Outcome(
        {f"n={row.n} {row.dtype} (GFLOP/s)": round(row.gflops, 1) for row in df.itertuples()}
    )


def u03_loss_curves(settings: Settings) -> Outcome:
    """A few training steps in every recipe: final loss and steps GradScaler skipped."""
    steps = 10 if _big(settings) else 3
    df = unit_run("u03").loss_curves(steps=steps, device=settings.device)
    figures: dict[str, Figure] = {}
    for mode, rows in df.groupby("mode", sort=False):
        figures[f"{mode}: loss after {steps} steps / skipped"] = (
            f"{rows['loss'].iloc[-1]:.4f} / {int(rows['skipped'].sum())}"
        )
    if not all(math.isfinite(x) for x in df["loss"]):
        return failed("a loss is not finite", figures)
    return Outcome(figures)


# --------------------------------------------------------------------------------------------
# unit 05
# --------------------------------------------------------------------------------------------
def u05_parity(settings: Settings) -> Outcome:
    """OffloadAdamW against the plain optimizer: largest parameter difference after 2 steps."""
    tiers = ("memory", "file") if _big(settings) else ("memory",)
    df = unit_run("u05").parity(steps=2, tiers=tiers, device=settings.device)
    return Outcome(
        {
            f"{row.dtype}, {row.tier}: max |diff| / min moved": (
                f"{row.max_abs_diff:.3g} / {row.min_param_moved:.3g}"
            )
            for row in df.itertuples()
        }
    )


def u05_memory_fit(settings: Settings) -> Outcome:
    """Device memory of a step with and without the offloaded optimizer."""
    df = unit_run("u05").memory_fit(device=settings.device)
    return Outcome(
        {
            f"{run}: peak / model state predicted (MiB)": (
                f"{_mib(row['peak'])} / {_mib(row['model_state_predicted'])}"
            )
            for run, row in df.iterrows()
        }
    )


def u05_step_breakdown(settings: Settings) -> Outcome:
    """The parts of an offloaded step (memory tier), medians over 2 steps, in ms."""
    df = unit_run("u05").step_breakdown(tier="memory", steps=2, device=settings.device)
    parts = [
        c for c in ("compute", "to_host", "host_adam", "to_device", "total", "plain") if c in df
    ]
    medians: pd.Series = df[parts].median()
    return Outcome({f"{part} (ms)": round(float(s) * 1e3, 3) for part, s in medians.items()})
