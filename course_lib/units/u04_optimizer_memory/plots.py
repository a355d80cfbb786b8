"""Plots of unit 04 (notebooks/04_optimizer_memory.ipynb): results -> matplotlib Figure.

Pure: nothing is measured here. Inputs are the DataFrames of
``course_lib.units.u04_optimizer_memory.run``.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.figure import Figure

from course_lib import kit
from course_lib.units.u04_optimizer_memory.run import ConvergenceRow, PerParamRow, StateRow
from course_lib.units.u04_optimizer_memory.run_accounting import AccountingRow
from course_lib.viz.plots import require_columns, style

READS = {
    StateRow: ("optimizer", "n_params", "predicted", "measured"),
    AccountingRow: ("source", "components", "bytes_per_param"),
    PerParamRow: ("total",),
    ConvergenceRow: ("optimizer", "step", "loss"),
}

#: one colour per optimizer
OPTIMIZER_COLORS = {
    "sgd": "tab:gray",
    "momentum": "tab:brown",
    "rmsprop": "tab:purple",
    "adagrad": "tab:pink",
    "adam": "tab:blue",
    "adamw": "tab:cyan",
    "adam8bit": "tab:green",
}
# first matching key wins (checked in this order, case-insensitive)
_PART_COLORS = {
    "scratch": "tab:purple",
    "master": "tab:olive",
    "adam": "tab:green",
    "params": "tab:blue",
    "weights": "tab:blue",
    "grads": "tab:orange",
}


def plot_state_bytes(df: pd.DataFrame) -> Figure:
    """Optimizer state in bytes per parameter: predicted (estimate) beside measured, per
    optimizer, with the measured residual written on each bar. ``df``: ``state_bytes_table()``."""
    require_columns(df, list(READS[StateRow]), "df")
    with style():
        fig, ax = plt.subplots(figsize=(11, 4.5))
        pred = df["predicted"] / df["n_params"]
        meas = df["measured"] / df["n_params"]
        colors = [OPTIMIZER_COLORS.get(o, "black") for o in df["optimizer"]]
        kit.bars_beside(ax, df["optimizer"], pred, meas, color=colors)
        for x, (_, row) in enumerate(df.iterrows()):
            res = row["measured"] - row["predicted"]
            ax.text(
                x + 0.2,
                row["measured"] / row["n_params"] + 0.1,
                f"{res:+,} B",
                ha="center",
                fontsize=10,
                rotation=90,
                va="bottom",
            )
        ax.set_ylabel("state bytes per parameter")
        ax.set_ylim(0, max(meas.max(), pred.max()) * 1.5 + 0.5)
        ax.set_title("Optimizer state of the tiny GPT (fp32 parameters)")
        ax.legend(loc="upper left")
        fig.tight_layout()
    return fig


def _part_color(name: str) -> str:
    for key, color in _PART_COLORS.items():
        if key in name.lower():
            return color
    return "tab:gray"


def plot_accounting(df: pd.DataFrame) -> Figure:
    """Horizontal stacked bars: the components of each bytes-per-parameter figure of the
    literature. ``df``: ``accounting_table()``."""
    require_columns(df, list(READS[AccountingRow]), "df")
    with style():
        fig, ax = plt.subplots(figsize=(12, 0.85 * len(df) + 1.5))
        for y, (_, row) in enumerate(df.iterrows()):
            left = 0
            for part in row["components"].split(" + "):
                name, nbytes = part.rsplit(" ", 1)
                ax.barh(y, int(nbytes), left=left, color=_part_color(name), edgecolor="white")
                # a 1-byte segment has room for its last word only ("m", "v")
                label = name.replace(" ", "\n", 1) if int(nbytes) >= 2 else name.rsplit(" ", 1)[-1]
                ax.text(left + int(nbytes) / 2, y, label, ha="center", va="center", fontsize=10)
                left += int(nbytes)
            ax.text(
                left + 0.2,
                y,
                f"{row['bytes_per_param']} B",
                va="center",
                fontsize=12,
                weight="bold",
            )
        ax.set_yticks(range(len(df)), df["source"])
        ax.invert_yaxis()
        ax.set_xlabel("bytes per parameter")
        ax.set_xlim(0, 23)
        ax.set_title("12, 16, 18 or 20 B/param: what each published figure counts")
        fig.tight_layout()
    return fig


def plot_mixed_precision_accounting(df: pd.DataFrame) -> Figure:
    """Stacked bars, bytes per parameter by component: predicted, measured at rest, measured peak
    during the optimizer step. ``df``: ``mixed_precision_accounting()``."""
    require_columns(df, list(READS[PerParamRow]), "df")
    parts = [c for c in df.columns if c != "total"]
    with style():
        fig, ax = plt.subplots(figsize=(10, 4.5))
        for y, (_label, row) in enumerate(df.iterrows()):
            left = 0.0
            for p in parts:
                ax.barh(
                    y,
                    row[p],
                    left=left,
                    color=_part_color(p),
                    edgecolor="white",
                    label=p
                    if y == 0 or (p.startswith("fp32 grads") and y == len(df) - 1)
                    else None,
                )
                left += row[p]
            ax.text(left + 0.2, y, f"{row['total']:.2f}", va="center", fontsize=12)
        ax.set_yticks(range(len(df)), list(df.index))
        ax.invert_yaxis()
        ax.set_xlabel("bytes per parameter")
        ax.set_xlim(0, df["total"].max() * 1.25)
        ax.set_title("Mixed-precision Adam (bf16 model + fp32 master): predicted vs measured")
        handles, labels = ax.get_legend_handles_labels()
        uniq = dict(zip(labels, handles))
        ax.legend(
            uniq.values(),
            uniq.keys(),
            loc="upper center",
            bbox_to_anchor=(0.45, -0.2),
            ncol=3,
            fontsize=10,
        )
        fig.tight_layout()
    return fig


def plot_convergence(df: pd.DataFrame, *, loss_floor: float | None = None) -> Figure:
    """Loss per step, one line per optimizer (same seed, same batches). ``df``: ``convergence()``."""
    require_columns(df, list(READS[ConvergenceRow]), "df")
    with style():
        fig, ax = plt.subplots(figsize=(11, 4.5))
        for name, sub in df.groupby("optimizer", sort=False):
            lr = f" (lr {sub['lr'].iloc[0]:g})" if "lr" in sub else ""
            ax.plot(
                sub["step"],
                sub["loss"],
                lw=2,
                color=OPTIMIZER_COLORS.get(name),
                label=f"{name}{lr}",
                ls="--" if name == "adam8bit" else "-",
            )
        if loss_floor is not None:
            ax.axhline(loss_floor, color="black", ls=":", label="best possible")
        ax.set_xlabel("step")
        ax.set_ylabel("training loss (nats)")
        ax.set_title("Same model, same batches, seven optimizers")
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=10)
        fig.tight_layout()
    return fig
