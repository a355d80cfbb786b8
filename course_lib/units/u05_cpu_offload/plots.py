"""Plots of unit 05 (notebooks/05_cpu_offload.ipynb): results -> matplotlib Figure.

Pure: nothing is measured here. Inputs are the DataFrames of
``course_lib.units.u05_cpu_offload.run``.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.figure import Figure

from course_lib.units.u05_cpu_offload.run import FitRow
from course_lib.units.u05_cpu_offload.run_bandwidth import StepRow, TierRow
from course_lib.viz.plots import CATEGORY_COLORS, require_columns, style

READS = {
    FitRow: ("model_state_measured", "activations", "model_state_predicted"),
    TierRow: ("GBps",),
    StepRow: ("compute", "to_host", "store_read", "host_adam", "store_write", "to_device", "total"),
}

#: one colour per part of an offloaded step
PART_COLORS = {
    "compute": "tab:blue",
    "to_host": "tab:orange",
    "store_read": "tab:brown",
    "host_adam": "tab:green",
    "store_write": "tab:pink",
    "to_device": "tab:red",
}


def plot_memory_fit(df: pd.DataFrame, budget_bytes: int, *, simulated: bool = True) -> Figure:
    """Device memory at the peak of a step, plain and offloaded: model state and activations
    stacked (measured), the predicted model state as a hatched outline, the budget as a line.
    ``df``: ``memory_fit()``; bytes shown in MiB."""
    require_columns(df, list(READS[FitRow]), "df", nonempty=True)
    mib = 2**20
    with style():
        fig, ax = plt.subplots(figsize=(10, 4.5))
        ys = range(len(df))
        ax.barh(
            list(ys),
            df["model_state_measured"] / mib,
            color=CATEGORY_COLORS["optimizer"],
            label="model state (measured)",
        )
        ax.barh(
            list(ys),
            df["activations"] / mib,
            left=df["model_state_measured"] / mib,
            color=CATEGORY_COLORS["activations"],
            label="activations + temporaries (measured)",
        )
        ax.barh(
            list(ys),
            df["model_state_predicted"] / mib,
            fill=False,
            hatch="//",
            edgecolor="black",
            label="model state (estimate)",
        )
        ax.axvline(
            budget_bytes / mib,
            color="black",
            ls="--",
            lw=2,
            label=f"{'simulated ' if simulated else ''}device budget",
        )
        ax.set_yticks(list(ys), list(df.index))
        ax.invert_yaxis()
        ax.set_xlabel("device memory at the step's peak (MiB)")
        ax.set_title("Offloading the optimizer: the step fits the budget")
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=2, fontsize=11)
        fig.tight_layout()
    return fig


def plot_tiers(df: pd.DataFrame, links: dict[str, float] | None = None) -> Figure:
    """Measured bandwidth of each tier (GB/s, log scale) beside published link speeds (dashed:
    not measured here). ``df``: ``tier_bandwidth()`` (or ``h2d_bandwidth()`` indexed by a label)."""
    require_columns(df, list(READS[TierRow]), "df", nonempty=True)
    links = links or {}
    with style():
        fig, ax = plt.subplots(figsize=(10, 0.6 * (len(df) + len(links)) + 1.5))
        labels = [f"{t} (measured)" for t in df.index] + [f"{k} (published)" for k in links]
        values = list(df["GBps"]) + list(links.values())
        colors = ["tab:blue"] * len(df) + ["lightgray"] * len(links)
        ax.barh(range(len(values)), values, color=colors, edgecolor="black")
        for y, v in enumerate(values):
            ax.text(v * 1.05, y, f"{v:.3g} GB/s", va="center", fontsize=11)
        ax.set_yticks(range(len(values)), labels)
        ax.invert_yaxis()
        ax.set_xscale("log")
        ax.set_xlim(min(values) / 2, max(values) * 4)
        ax.set_xlabel("GB/s (1e9 bytes/s), log scale")
        ax.set_title("Where state can live, and how fast it moves")
        fig.tight_layout()
    return fig


def plot_step_breakdown(df: pd.DataFrame, *, predicted: dict[str, float] | None = None) -> Figure:
    """One stacked bar per measured step (its parts) beside its own measured total (black tick),
    the plain step (grey tick) and, if given, the predicted serial and overlapped times of the
    median parts (dashed lines). ``df``: ``step_breakdown()``; seconds shown in ms."""
    parts = [p for p in PART_COLORS if p in df.columns]
    require_columns(df, ["total", *parts], "df", nonempty=True)
    with style():
        fig, ax = plt.subplots(figsize=(11, 4.5))
        xs = list(range(len(df)))
        bottom = [0.0] * len(df)
        for p in parts:
            vals = list(df[p] * 1e3)
            ax.bar(xs, vals, bottom=bottom, color=PART_COLORS[p], width=0.6, label=p)
            bottom = [b + v for b, v in zip(bottom, vals)]
        ax.scatter(
            xs,
            df["total"] * 1e3,
            marker="_",
            s=900,
            color="black",
            lw=3,
            zorder=3,
            label="total (measured, own clock)",
        )
        if "plain" in df.columns:
            ax.scatter(
                xs,
                df["plain"] * 1e3,
                marker="_",
                s=900,
                color="gray",
                lw=3,
                zorder=3,
                label="plain step, no offload",
            )
        for key, ls in (("serial_s", "--"), ("overlapped_s", ":")):
            if predicted and key in predicted:
                ax.axhline(
                    predicted[key] * 1e3,
                    color="black",
                    ls=ls,
                    lw=1.5,
                    label=f"estimate, {key[:-2]} (median parts)",
                )
        ax.set_xticks(xs, [f"step {i}" for i in xs])
        ax.set_ylabel("ms")
        ax.set_title("An offloaded step, part by part")
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=10)
        fig.tight_layout()
    return fig
