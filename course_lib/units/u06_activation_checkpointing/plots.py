"""Unit 06's figures (notebooks/06_activation_checkpointing.ipynb): results -> matplotlib Figure.

Pure: nothing is measured here. Inputs are the DataFrames of
``course_lib.units.u06_activation_checkpointing.run``.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.figure import Figure

from course_lib import kit
from course_lib.units.u06_activation_checkpointing.run import PolicyRow, SegmentRow, TimeRow
from course_lib.units.u06_activation_checkpointing.run_scale import PaperScaleRow
from course_lib.viz.plots import require_columns, styled

READS = {
    PolicyRow: ("case", "kept_predicted", "kept_measured", "flops_ratio"),
    TimeRow: ("case", "time_ratio"),
    SegmentRow: ("k", "kept_predicted", "kept_measured", "peak_predicted", "peak_measured"),
    PaperScaleRow: ("model", "policy", "kept_GB"),
}


@styled
def plot_policies(df: pd.DataFrame, times: pd.DataFrame | None = None) -> Figure:
    """Left: bytes kept for backward per policy, predicted beside measured (KiB). Right: the
    step's matmul FLOPs relative to no checkpointing (measured), and the time ratio if given."""
    require_columns(df, list(READS[PolicyRow]), "df", nonempty=True)
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 4.8))
    xs = list(range(len(df)))
    kit.bars_beside(
        ax,
        df["case"],
        df["kept_predicted"],
        df["kept_measured"],
        scale=1024,
        names=("predicted (estimate)", "measured (MemoryMeter)"),
    )
    ax.set_xticks(xs, df["case"], rotation=30, ha="right")
    ax.set_ylabel("activation KiB kept when forward ends")
    ax.set_title("Memory kept for backward")
    ax.legend()
    bx.bar(
        [x - 0.2 for x in xs],
        df["flops_ratio"],
        width=0.4,
        color="tab:orange",
        label="matmul FLOPs (FlopCounterMode)",
    )
    if times is not None:
        require_columns(times, list(READS[TimeRow]), "times")
        t = times.set_index("case")["time_ratio"].reindex(df["case"])
        bx.bar([x + 0.2 for x in xs], t, width=0.4, color="tab:gray", label="time (noisy on CPU)")
    bx.axhline(4 / 3, color="black", ls="--", lw=1, label="4/3: one more forward")
    bx.axhline(1.0, color="black", lw=0.8)
    bx.set_xticks(xs, df["case"], rotation=30, ha="right")
    bx.set_ylabel("relative to no checkpointing")
    bx.set_title("What it costs")
    bx.legend(fontsize=9)
    fig.tight_layout()
    return fig


@styled
def plot_segment_sweep(df: pd.DataFrame) -> Figure:
    """Kept bytes and backward peak against the segment length k, predicted and measured (KiB)."""
    require_columns(df, list(READS[SegmentRow]), "df", nonempty=True)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for what, color, marker, rule in (
        ("kept", "tab:blue", "o", ""),
        ("peak", "tab:red", "s", " (kept + k blocks)"),
    ):
        kit.line_beside(
            ax,
            df["k"],
            df[f"{what}_predicted"],
            df[f"{what}_measured"],
            color=color,
            marker=marker,
            scale=1024,
            names=(f"{what}, predicted{rule}", f"{what}, measured"),
        )
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(df["k"]), [str(k) for k in df["k"]])
    ax.set_xlabel("blocks per checkpoint (segment length k)")
    ax.set_ylabel("activation KiB")
    ax.set_title("Segments: fewer checkpoints, bigger rebuilds")
    ax.legend(fontsize=9)
    fig.tight_layout()
    return fig


@styled
def plot_scale(df: pd.DataFrame) -> Figure:
    """Activation GB kept per policy for the sources' models (log scale), 16-bit."""
    require_columns(df, list(READS[PaperScaleRow]), "df", nonempty=True)
    fig, ax = plt.subplots(figsize=(11, 4.5))
    models = list(dict.fromkeys(df["model"]))
    policies = list(dict.fromkeys(df["policy"]))
    width = 0.8 / len(policies)
    colors = {"none": "tab:gray", "selective": "tab:green", "full": "tab:blue"}
    for j, pol in enumerate(policies):
        sub = df[df["policy"] == pol].set_index("model").reindex(models)
        xs = [i + (j - (len(policies) - 1) / 2) * width for i in range(len(models))]
        ax.bar(xs, sub["kept_GB"], width=width, color=colors.get(pol, "tab:purple"), label=pol)
        for x, v in zip(xs, sub["kept_GB"]):
            ax.text(x, v * 1.1, f"{v:,.1f}", ha="center", fontsize=9)
    ax.axhline(80, color="red", ls=":", label="80 GB (one H100)")
    ax.set_yscale("log")
    ax.set_xticks(range(len(models)), models)
    ax.set_ylabel("activation GB kept (1e9 B)")
    ax.set_title("Korthikanti et al.'s counts at paper scale")
    ax.legend()
    fig.tight_layout()
    return fig
