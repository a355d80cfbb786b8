"""Figures of unit 17 (notebooks/17_fp8_training.ipynb): results of ``run.py`` -> matplotlib Figure.

Pure: nothing is measured here.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd

from course_lib.units.u17_fp8_training.run_training import CurveRow
from course_lib.viz.plots import require_columns, style

__all__ = ["PRECISION_COLORS", "plot_outliers", "plot_curves", "plot_spike", "plot_allgather"]

READS = {CurveRow: ("precision", "step", "loss")}

#: one colour per precision or recipe
PRECISION_COLORS = {
    "fp32": "black",
    "bf16": "tab:gray",
    "tensorwise": "tab:red",
    "rowwise": "tab:orange",
    "blockwise": "tab:green",
    "delayed": "tab:purple",
    "unscaled": "tab:brown",
}


def plot_outliers(df: pd.DataFrame):
    """Error of the ordinary channels and of the layer's output against the outlier's size, one
    line per cast (log-log). ``df``: ``run.outlier_table()``."""
    require_columns(
        df, ["outlier x", "cast", "error, other channels", "output error"], "df", nonempty=True
    )
    with style():
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharex=True)
        for cast, sub in df.groupby("cast", sort=False):
            for ax, col in zip(axes, ("error, other channels", "output error")):
                ax.plot(sub["outlier x"], sub[col], marker="o", lw=2, label=cast)
        for ax, title in zip(axes, ("the other 127 channels", "the layer's output x W^T")):
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel("outlier channel multiplied by")
            ax.set_ylabel("relative error (measured)")
            ax.set_title(title)
        axes[0].legend(loc="upper left", fontsize=9)
        fig.suptitle("One outlier channel in real activations of the unit's GPT, cast to E4M3")
        fig.tight_layout()
    return fig


def plot_curves(df: pd.DataFrame):
    """Loss per step of each precision (log scale). ``df``: ``run.train_curves()``."""
    require_columns(df, ["precision", "step", "loss"], "df", nonempty=True)
    with style():
        fig, ax = plt.subplots(figsize=(10, 4.5))
        for p, sub in df.groupby("precision", sort=False):
            ref = p == "fp32"  # drawn on top, dashed: the others lie on it
            ax.plot(
                sub["step"],
                sub["loss"],
                lw=2.5 if ref else 1.6,
                ls="--" if ref else "-",
                zorder=3 if ref else 2,
                color=PRECISION_COLORS.get(p),
                label=p,
            )
        ax.set_yscale("log")
        ax.set_xlabel("step")
        ax.set_ylabel("training loss (nats, log scale)")
        ax.set_title(
            "The unit's GPT from one seed on the same batches (FP8 GEMMs computed on the CPU)"
        )
        ax.legend(loc="upper right", fontsize=9)
        fig.tight_layout()
    return fig


def plot_spike(df: pd.DataFrame):
    """Forward error per step under current and delayed scaling around a spike (log scale).
    ``df``: ``run.delayed_spike()``."""
    require_columns(df, ["step", "scaling", "output error"], "df", nonempty=True)
    with style():
        fig, ax = plt.subplots(figsize=(10, 4))
        for name, sub in df.groupby("scaling", sort=False):
            ax.plot(sub["step"], sub["output error"], marker="o", lw=2, label=name)
        ax.set_yscale("log")
        ax.set_xlabel("step (one new input per step; the spike is the jump)")
        ax.set_ylabel("relative error of x W^T")
        ax.set_title("Delayed scaling trusts the past: a spike it has not seen saturates")
        ax.legend()
        fig.tight_layout()
    return fig


def plot_allgather(summary: pd.DataFrame):
    """All-gather bytes per step: measured on the wire beside the prediction, per gather dtype.
    ``summary``: ``run.allgather_summary()``."""
    require_columns(summary, ["gather", "predicted", "wire (measured)"], "summary", nonempty=True)
    with style():
        fig, ax = plt.subplots(figsize=(8, 4))
        x = range(len(summary))
        ax.bar(
            [i - 0.2 for i in x], summary["wire (measured)"] / 1024, 0.4, label="measured (wire)"
        )
        ax.bar([i + 0.2 for i in x], summary["predicted"] / 1024, 0.4, label="predicted (estimate)")
        ax.set_xticks(list(x), [f"{g} gather" for g in summary["gather"]])
        ax.set_ylabel("KiB sent per rank per step")
        ax.set_title("ZeRO-3 all-gathers of the unit's GPT, rank 0")
        ax.legend()
        fig.tight_layout()
    return fig
