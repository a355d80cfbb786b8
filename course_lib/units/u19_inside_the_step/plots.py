"""Unit 19's figures (notebooks/19_inside_the_step.ipynb). Data in (what run.py returned),
matplotlib Figure out, drawn in the course style; nothing is measured here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from course_lib.units.u19_inside_the_step.run_fusion import FusionBytesRow
from course_lib.units.u19_inside_the_step.run_roofline import OpRow
from course_lib.viz.plots import require_columns, styled

__all__ = [
    "plot_top_ops",
    "plot_timeline",
    "plot_roofline",
    "plot_fusion",
    "plot_memory_sweep",
    "plot_flash_point",
]

READS = {
    OpRow: ("op", "flops", "intensity", "predicted_us"),
    FusionBytesRow: ("op", "bytes", "path"),
}

_KIND_COLORS = {
    "op": "tab:blue",
    "backward": "tab:green",
    "comm": "tab:red",
    "kernel": "tab:purple",
}


@styled
def plot_top_ops(table: pd.DataFrame, *, top: int = 12, title: str = "") -> Figure:
    """Self CPU time of the ``top`` operators of a profile (``StepProfile.table()``), ms."""
    require_columns(table, ["name", "self_cpu_us", "calls"], "table", nonempty=True)
    part = table.nlargest(top, "self_cpu_us").iloc[::-1]
    fig, ax = plt.subplots(figsize=(10, 0.35 * len(part) + 1.5))
    ax.barh(part.name, part.self_cpu_us / 1e3, color="tab:blue")
    for y, (ms, calls) in enumerate(zip(part.self_cpu_us / 1e3, part.calls)):
        ax.text(ms, y, f" {calls}x", va="center", fontsize=11)
    ax.set_xlabel("self CPU time in the step (ms, all calls)")
    ax.set_title(title or f"Where one training step's time goes: the top {len(part)} operators")
    fig.tight_layout()
    return fig


@styled
def plot_timeline(timelines: Sequence[pd.DataFrame], *, title: str = "") -> Figure:
    """Top-level events of each profile (``StepProfile.timeline()``), one lane per (rank,
    thread), coloured by kind: operators, backward nodes, collectives, GPU kernels; ms."""
    frames = [t for t in timelines if len(t)]
    if not frames:
        raise ValueError("timelines = []: expected at least one non-empty StepProfile.timeline()")
    for t in frames:
        require_columns(t, ["thread", "start_us", "duration_us", "kind", "rank"], "timeline")
    lanes = sorted({(int(r), int(th)) for t in frames for r, th in zip(t["rank"], t.thread)})
    fig, ax = plt.subplots(figsize=(12, 0.6 * len(lanes) + 2.2))
    for t in frames:
        for row in t.itertuples():
            y = lanes.index((int(row.rank), int(row.thread)))
            ax.barh(y, row.duration_us / 1e3, left=row.start_us / 1e3, height=0.7,
                    color=_KIND_COLORS[row.kind], edgecolor="white", linewidth=0.3)  # fmt: skip
    ax.set_yticks(range(len(lanes)), [f"rank {r}, thread {th}" for r, th in lanes])
    ax.invert_yaxis()
    kinds = {k for t in frames for k in t.kind}
    handles = [Patch(color=c, label=k) for k, c in _KIND_COLORS.items() if k in kinds]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=11)
    ax.set_xlabel(
        "time from the start of each rank's profiled step (ms; ranks' clocks not aligned)"
    )
    ax.set_title(title or "The step's timeline, as the profiler recorded it")
    fig.tight_layout()
    return fig


@styled
def plot_roofline(
    tables: Mapping[str, pd.DataFrame], roofs: Mapping[str, Mapping[str, Any]]
) -> Figure:
    """Operators on a roofline, one panel per machine: arithmetic intensity (FLOP/B) against
    FLOP/s, the roofs min(peak, intensity x bandwidth); predicted points hollow, measured ones
    (a ``measured_us`` column) filled. ``tables``: machine -> ``run.op_table`` result."""
    fig, axes = plt.subplots(1, len(tables), figsize=(6.2 * len(tables), 5), squeeze=False)
    for ax, (name, table) in zip(axes[0], tables.items()):
        require_columns(table, list(READS[OpRow]), "table", nonempty=True)
        roof = roofs[name]
        xs = np.logspace(-2, 4, 200)
        ax.loglog(xs, np.minimum(roof["flops_per_s"], xs * roof["bytes_per_s"]), "k-", lw=1.5)
        ax.axvline(roof["flops_per_s"] / roof["bytes_per_s"], color="grey", ls=":", lw=1)
        for i, row in enumerate(table.itertuples()):
            color = plt.get_cmap("tab10")(i % 10)
            ax.loglog(row.intensity, row.flops / (row.predicted_us * 1e-6), "o", mfc="none",
                      color=color, ms=9, label=row.op)  # fmt: skip
            if "measured_us" in table.columns:
                ax.loglog(row.intensity, row.flops / (row.measured_us * 1e-6), "o",
                          color=color, ms=7)  # fmt: skip
        ax.set_xlabel("arithmetic intensity (FLOP per byte moved)")
        ax.set_ylabel("FLOP/s")
        ax.set_title(
            f"{roof['name']}\nridge at {roof['flops_per_s'] / roof['bytes_per_s']:.0f} FLOP/B"
        )
    axes[0][-1].legend(fontsize=10, loc="lower right")
    fig.tight_layout()
    return fig


@styled
def plot_fusion(bytes_df: pd.DataFrame, timing: Mapping[str, Any]) -> Figure:
    """Left: bytes moved, eager (stacked by operator) and fused; right: median ms of each,
    measured (the compiled bar is missing where compilation was not possible)."""
    require_columns(bytes_df, list(READS[FusionBytesRow]), "bytes_df", nonempty=True)
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    bottom = 0.0
    for row in bytes_df[bytes_df.path == "eager"].itertuples():
        left.bar("eager", row.bytes / 2**20, bottom=bottom, label=row.op)
        bottom += row.bytes / 2**20
    fused = bytes_df[bytes_df.path == "fused"].bytes.sum() / 2**20
    left.bar("fused", fused, color="black", label="fused loop")
    left.set_ylabel("bytes read + written (MiB, predicted)")
    left.legend(fontsize=10)
    left.set_title(f"Predicted traffic: {bottom / fused:.1f}x less when fused")
    names, values = ["eager"], [timing["eager_ms"]]
    if timing.get("compiled_ms") is not None:
        names.append("torch.compile")
        values.append(timing["compiled_ms"])
    right.bar(names, values, color=["tab:blue", "black"][: len(values)])
    right.set_ylabel("median time of one call (ms, measured)")
    right.set_title("Measured here" + ("" if len(values) > 1 else " (no compiler)"))
    fig.tight_layout()
    return fig


@styled
def plot_memory_sweep(sweep: pd.DataFrame) -> Figure:
    """Bytes saved for backward (left) and peak bytes of forward + backward (right) against
    the sequence length, FlashAttention and the written-out attention, log-log, with flash's
    prediction."""
    cols = ["seq", "flash_saved_bytes", "naive_saved_bytes", "flash_peak_bytes", "naive_peak_bytes"]
    require_columns(sweep, cols + ["flash_predicted_bytes"], "sweep", nonempty=True)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, what in zip(axes, ("saved", "peak")):
        for name, color in (("flash", "tab:blue"), ("naive", "tab:red")):
            ax.loglog(sweep.seq, sweep[f"{name}_{what}_bytes"] / 2**10, "o-", color=color,
                      label=f"{name} (measured)")  # fmt: skip
        if what == "saved":
            ax.loglog(sweep.seq, sweep.flash_predicted_bytes / 2**10, "k--", lw=1,
                      label="4 B x heads x seq x (head_dim + 1)")  # fmt: skip
        ax.set_xlabel("sequence length (tokens)")
        ax.set_ylabel("KiB")
        ax.set_title("saved for backward" if what == "saved" else "peak, forward + backward")
        ax.legend(fontsize=10)
    fig.tight_layout()
    return fig


@styled
def plot_flash_point(point: Mapping[str, Any]) -> Figure:
    """One ``run.attention_memory`` result: saved and peak KiB of flash and naive side by side."""
    fig, ax = plt.subplots(figsize=(8, 4))
    x = np.arange(2)
    for i, (name, color) in enumerate((("flash", "tab:blue"), ("naive", "tab:red"))):
        vals = [point[f"{name}_saved_bytes"] / 2**10, point[f"{name}_peak_bytes"] / 2**10]
        ax.bar(x + (i - 0.5) * 0.38, vals, width=0.38, color=color, label=name)
    ax.set_xticks(x, ["saved for backward", "peak (forward + backward)"])
    ax.set_ylabel("KiB (measured)")
    ax.set_title(f"seq {point['seq']}, block {point['block_size']}, causal {point['causal']}")
    ax.legend()
    fig.tight_layout()
    return fig
