"""Plots of unit 01 (notebooks/01_backprop_memory.ipynb): results -> matplotlib Figure.

Pure functions: they take the DataFrames of course_lib.units.u01_backprop_memory.run and return a
Figure; nothing is measured here.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.figure import Figure

from course_lib import kit
from course_lib.measure.estimate import MiB, fmt_bytes
from course_lib.units.u01_backprop_memory.run import OptimizerRow, ScalingRow
from course_lib.viz.plots import CATEGORY_COLORS, require_columns, style

READS = {
    ScalingRow: ("batch", "width", "category", "measured", "predicted"),
    OptimizerRow: ("optimizer", "measured", "predicted"),
}

# params and grads are equal in fp32: different markers keep both visible where they overlap
_MARKERS = {"params": "s", "grads": "o", "optimizer": "^", "activations": "D"}


def plot_scaling_sweep(sweep: pd.DataFrame, *, title: str | None = None) -> Figure:
    """Bytes per category against batch (left, at the largest width) and against width (right, at
    the largest batch): measured as markers, predicted as dashed lines, MiB on log-log axes."""
    require_columns(sweep, list(READS[ScalingRow]), "sweep")
    with style():
        fig, (ax_b, ax_w) = plt.subplots(1, 2, figsize=(13, 5.5), sharey=True)
        for ax, x, fixed in ((ax_b, "batch", "width"), (ax_w, "width", "batch")):
            at = sweep[fixed].max()
            part = sweep[sweep[fixed] == at]
            for cat, rows in part.groupby("category", sort=False):
                rows = rows.sort_values(x)
                color = CATEGORY_COLORS.get(cat, "black")
                ax.plot(rows[x], rows["predicted"] / MiB, "--", color=color, alpha=0.7)
                # a category that is 0 (SGD's optimizer state) cannot sit on a log axis
                shown = rows[rows["measured"] > 0]
                ax.plot(
                    shown[x],
                    shown["measured"] / MiB,
                    _MARKERS.get(cat, "o"),
                    color=color,
                    label=cat,
                    ms=9 if cat == "params" else 6,
                    mfc="none" if cat == "params" else color,
                )
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel(f"{x} ({fixed} = {at})")
            ax.grid(True, which="both", alpha=0.3)
        ax_b.set_ylabel("MiB")
        ax_w.legend(loc="upper left", fontsize=11)
        fig.suptitle(
            title
            or "Measured (markers) vs estimate (dashed lines): model state follows\n"
            "the width; activations follow batch x width"
        )
        fig.tight_layout()
        return fig


def plot_optimizer_states(table: pd.DataFrame, *, title: str | None = None) -> Figure:
    """Measured vs predicted optimizer-state bytes per optimizer (bars, MiB)."""
    require_columns(table, list(READS[OptimizerRow]), "table")
    with style():
        fig, ax = plt.subplots(figsize=(10, 5))
        bars = kit.bars_beside(
            ax,
            table["optimizer"],
            table["predicted"],
            table["measured"],
            color=CATEGORY_COLORS["optimizer"],
            scale=MiB,
            width=0.38,
            names=("estimate", "measured"),
            predicted_style={"color": "tab:gray"},
        )
        # label every measured bar, so SGD's 0 B is visible too
        ax.bar_label(bars, labels=[fmt_bytes(int(b)) for b in table["measured"]], padding=3)
        ax.margins(y=0.15)
        ax.set_ylabel("optimizer state (MiB)")
        ax.legend()
        ax.set_title(title or "Optimizer state: 0, 1 or 2 tensors the size of the parameters")
        fig.tight_layout()
        return fig
