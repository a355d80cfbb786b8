"""Plots of unit 02 (notebooks/02_batch_size_and_accumulation.ipynb): results -> matplotlib Figure.

Pure functions over the DataFrames of course_lib.units.u02_batch_size_and_accumulation.run; nothing is measured here.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from course_lib.measure.estimate import GB, MiB
from course_lib.units.u02_batch_size_and_accumulation.run import (
    AccumulationRow,
    ProbeRow,
    ThroughputRow,
)
from course_lib.units.u02_batch_size_and_accumulation.run_roofline import RooflineRow
from course_lib.units.u02_batch_size_and_accumulation.run_scale import EvalRow, PredictionRow
from course_lib.viz.plots import require_columns, style

READS = {
    PredictionRow: ("batch", "predicted_samples_per_s", "measured_samples_per_s"),
    EvalRow: ("run", "samples", "eval_loss"),
    RooflineRow: ("op", "intensity", "flop_per_s"),
    ThroughputRow: ("batch", "samples_per_s", "activation_bytes", "predicted_activation_bytes"),
    AccumulationRow: ("accumulation_steps", "mode", "peak_bytes", "median_s"),
    ProbeRow: ("batch", "peak_bytes", "fits"),
}


def plot_throughput_prediction(df: pd.DataFrame, *, title: str | None = None):
    """Samples/s against the batch: the roofline's bound (line) and the measurement (markers)."""
    require_columns(df, list(READS[PredictionRow]), "df")
    with style():
        fig, ax = plt.subplots(figsize=(11, 5))
        ax.plot(
            df["batch"],
            df["predicted_samples_per_s"],
            "k--",
            lw=2,
            label="roofline bound (predicted)",
        )
        ax.plot(df["batch"], df["measured_samples_per_s"], "o-", ms=9, label="measured")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("batch (samples)")
        ax.set_ylabel("samples / s")
        ax.set_title(title or "Throughput: the roofline's bound vs measured")
        ax.legend()
        fig.tight_layout()
        return fig


def plot_lr_scaling(df: pd.DataFrame, *, title: str | None = None):
    """Held-out loss against samples seen, one line per (batch, learning rate) run."""
    require_columns(df, list(READS[EvalRow]), "df")
    with style():
        fig, ax = plt.subplots(figsize=(11, 5))
        for name, part in df.groupby("run", sort=False):
            ax.plot(part["samples"], part["eval_loss"], marker="o", ms=5, label=name)
        ax.set_xlabel("training samples seen")
        ax.set_ylabel("held-out loss")
        ax.set_title(title or "Same samples, different batch and learning rate")
        ax.legend()
        fig.tight_layout()
        return fig


def plot_roofline(ops: pd.DataFrame, machine: dict, *, title: str | None = None):
    """Log-log roofline: attainable GFLOP/s = min(peak, intensity x bandwidth), with each op's
    measured GFLOP/s at its arithmetic intensity (FLOP/B)."""
    require_columns(ops, list(READS[RooflineRow]), "ops")
    for key in ("peak_flop_per_s", "bandwidth_bytes_per_s", "ridge_flop_per_byte"):
        if key not in machine:
            raise ValueError(f"machine is missing {key!r}; it has {sorted(machine)}")
    peak, bw, ridge = (
        machine[k] for k in ("peak_flop_per_s", "bandwidth_bytes_per_s", "ridge_flop_per_byte")
    )
    lo = min(ops["intensity"].min(), ridge) / 4
    hi = max(ops["intensity"].max(), ridge) * 4
    xs = np.geomspace(lo, hi, 200)
    with style():
        fig, ax = plt.subplots(figsize=(12, 5.5))
        ax.plot(
            xs,
            np.minimum(peak, xs * bw) / GB,
            "k-",
            lw=2,
            label=f"roof: {peak / GB:.0f} GFLOP/s, {bw / GB:.1f} GB/s",
        )
        ax.axvline(ridge, color="gray", ls=":", label=f"ridge point {ridge:.1f} FLOP/B")
        for _, row in ops.iterrows():
            marker = "s" if row["op"].startswith("matmul") else "o"
            ax.plot(row["intensity"], row["flop_per_s"] / GB, marker, ms=8, label=row["op"])
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("arithmetic intensity (FLOP per byte moved)")
        ax.set_ylabel("GFLOP/s")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=11, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        ax.set_title(
            title
            or f"Roofline of this machine ({machine.get('device', '?')}): roof and points measured"
        )
        fig.tight_layout()
        return fig


def plot_throughput_vs_batch(df: pd.DataFrame, *, title: str | None = None):
    """Samples/s (left) and activation MiB measured vs estimate (right) against batch size."""
    require_columns(df, list(READS[ThroughputRow]), "df")
    with style():
        fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(13, 5))
        ax_t.plot(df["batch"], df["samples_per_s"], "o-", color="tab:blue")
        ax_t.set_xscale("log", base=2)
        ax_t.set_yscale("log")
        ax_t.set_xlabel("batch size")
        ax_t.set_ylabel("samples / s (median step time)")
        ax_t.set_title("Throughput (measured)")
        ax_t.grid(True, alpha=0.3)
        ax_m.plot(
            df["batch"],
            df["predicted_activation_bytes"] / MiB,
            "--",
            color="gray",
            label="estimate",
        )
        ax_m.plot(df["batch"], df["activation_bytes"] / MiB, "o", color="tab:red", label="measured")
        ax_m.set_xlabel("batch size")
        ax_m.set_ylabel("activations after forward (MiB)")
        ax_m.set_title("Activations: measured vs estimate")
        ax_m.legend()
        ax_m.grid(True, alpha=0.3)
        fig.suptitle(title or "Bigger batches: more samples/s (until compute-bound), linear memory")
        fig.tight_layout()
        return fig


def plot_accumulation(df: pd.DataFrame, *, title: str | None = None):
    """Peak MiB (left) and seconds per effective batch (right) against accumulation steps, for
    accumulated micro-batches vs one full batch of the same effective size."""
    require_columns(df, list(READS[AccumulationRow]), "df")
    with style():
        fig, (ax_m, ax_t) = plt.subplots(1, 2, figsize=(13, 5))
        for mode, rows in df.groupby("mode", sort=False):
            line = "o-" if mode == "accumulated" else "s--"
            ax_m.plot(rows["accumulation_steps"], rows["peak_bytes"] / MiB, line, label=mode)
            ax_t.plot(rows["accumulation_steps"], rows["median_s"] * 1e3, line, label=mode)
        for ax in (ax_m, ax_t):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("accumulation steps k")
            ax.grid(True, alpha=0.3)
            ax.legend()
        ax_m.set_ylabel("peak memory of one step (MiB)")
        ax_m.set_title("Peak memory (measured)")
        ax_t.set_ylabel("ms per effective batch (median)")
        ax_t.set_title("Time per effective batch (measured)")
        fig.suptitle(
            (title or "Gradient accumulation trades time for memory")
            + "\neffective batch = micro-batch x k"
        )
        fig.tight_layout()
        return fig


def plot_batch_search(
    probes: pd.DataFrame, capacity_bytes: int, *, label: str = "budget", title: str | None = None
):
    """Measured peak of every probed batch against the budget line (fits: green, not: red)."""
    require_columns(probes, list(READS[ProbeRow]), "probes")
    rows = probes.sort_values("batch")
    with style():
        fig, ax = plt.subplots(figsize=(11, 5))
        ax.plot(rows["batch"], rows["peak_bytes"] / MiB, "-", color="gray", alpha=0.5)
        ok, bad = rows[rows["fits"]], rows[~rows["fits"]]
        ax.plot(ok["batch"], ok["peak_bytes"] / MiB, "o", color="tab:green", label="fits")
        ax.plot(
            bad["batch"], bad["peak_bytes"] / MiB, "x", color="tab:red", ms=9, label="out of memory"
        )
        ax.axhline(capacity_bytes / MiB, color="black", ls="--", label=label)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch size (probes: doubling, then bisection)")
        ax.set_ylabel("measured peak of one step (MiB)")
        ax.legend()
        ax.grid(True, alpha=0.3)
        ax.set_title(title or "Largest batch that fits: measured peak per probe")
        fig.tight_layout()
        return fig


def plot_budget_check(
    df: pd.DataFrame, capacity_bytes: int, *, label: str = "budget", title: str | None = None
):
    """One bar per mode: measured peak of one optimizer step beside the budget line (fits:
    green, out of memory: red). ``df``: the explorer's result (mode, peak_bytes, fits)."""
    require_columns(df, ["mode", "peak_bytes", "fits"], "df")
    with style():
        fig, ax = plt.subplots(figsize=(9, 3.5))
        colors = ["tab:green" if f else "tab:red" for f in df["fits"]]
        ax.barh(df["mode"], df["peak_bytes"] / MiB, color=colors)
        ax.axvline(capacity_bytes / MiB, color="black", ls="--", label=label)
        ax.set_xlabel("measured peak of one optimizer step (MiB)")
        ax.set_title(title or "green: fits the budget, red: out of memory")
        ax.legend(fontsize=11, loc="lower right")
        fig.tight_layout()
        return fig
