"""Plots of unit 03 (notebooks/03_mixed_precision.ipynb): results -> matplotlib Figure.

Pure: nothing is measured here. Inputs are the DataFrames of
``course_lib.units.u03_mixed_precision.run``. Memory in MiB (2**20 bytes) unless said otherwise.
"""

from __future__ import annotations

import math
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from course_lib import validate
from course_lib.techniques.precision import BitLayout
from course_lib.units.u03_mixed_precision.run import LossRow, MatmulRow, ModeMemoryRow
from course_lib.viz.plots import CATEGORY_COLORS, require_columns, style

READS = {
    ModeMemoryRow: ("mode", "category", "measured", "predicted"),
    MatmulRow: ("n", "dtype", "gflops"),
    LossRow: ("mode", "step", "loss", "skipped", "scale"),
    BitLayout: ("bits", "exponent_bits", "mantissa_bits", "max", "smallest_subnormal", "eps"),
}

#: one colour per training recipe
MODE_COLORS = {
    "fp32": "tab:blue",
    "bf16-mixed": "tab:green",
    "fp16-mixed": "tab:orange",
    "bf16-true": "tab:red",
}


def plot_bit_layouts(table: pd.DataFrame) -> Figure:
    """One bar per format split into sign / exponent / mantissa bits, annotated with the range
    (largest value, smallest subnormal) and eps. ``table``: ``format_table()``."""
    require_columns(table, list(READS[BitLayout]), "table")
    names = list(table.index)
    with style():
        fig, ax = plt.subplots(figsize=(12, 0.9 * len(names) + 1.2))
        for y, name in enumerate(names):
            row = table.loc[name]
            e, m = int(row["exponent_bits"]), int(row["mantissa_bits"])
            ax.barh(y, 1, left=0, color="tab:gray", label="sign" if y == 0 else None)
            ax.barh(y, e, left=1, color="tab:blue", label="exponent (range)" if y == 0 else None)
            ax.barh(
                y,
                m,
                left=1 + e,
                color="tab:orange",
                label="mantissa (precision)" if y == 0 else None,
            )
            ax.text(1 + e / 2, y, str(e), ha="center", va="center", color="white", fontsize=12)
            ax.text(1 + e + m / 2, y, str(m), ha="center", va="center", fontsize=12)
            ax.text(
                33,
                y,
                f"max {row['max']:.3g}, smallest {row['smallest_subnormal']:.2g}, eps {row['eps']:.2g}",
                va="center",
                fontsize=11,
            )
        ax.set_yticks(range(len(names)), names)
        ax.invert_yaxis()
        ax.set_xlim(0, 56)
        ax.set_xlabel("bits")
        ax.set_title("Float formats: sign | exponent | mantissa (from torch.finfo)")
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=3, fontsize=11)
        fig.tight_layout()
    return fig


def _mark_fp16_range(ax: Axes, fp16: Any) -> None:
    """fp16's smallest subnormal, smallest normal and max as dashed lines, labelled above the
    axes where no bar can hide them."""
    for x, text, color in (
        (math.log2(fp16.smallest_subnormal), "fp16: 0 below", "tab:red"),
        (math.log2(fp16.smallest_normal), "fp16 normal", "tab:orange"),
        (math.log2(fp16.max), "fp16 max", "tab:red"),
    ):
        ax.axvline(x, color=color, ls="--")
        ax.text(
            x,
            1.01,
            text,
            color=color,
            transform=ax.get_xaxis_transform(),
            ha="center",
            va="bottom",
            fontsize=11,
        )


def plot_gradient_histogram(
    abs_grads: Any, *, scale: float = 1.0, fp16_table: pd.DataFrame | None = None
) -> Figure:
    """Histogram of log2 |gradient| (a real backward), with fp16's smallest subnormal and smallest
    normal and bf16's smallest normal marked; with ``scale`` != 1 the scaled histogram too."""
    import torch

    from course_lib.techniques.precision import bit_layout

    if not isinstance(abs_grads, torch.Tensor) or abs_grads.numel() == 0:
        raise ValueError("abs_grads must be a non-empty tensor of gradient magnitudes")
    scale = validate.number("scale", scale, positive=True)
    lg = abs_grads.double().log2()
    fp16, bf16 = bit_layout("fp16"), bit_layout("bf16")
    with style():
        fig, ax = plt.subplots(figsize=(11, 4.5))
        lo = min(math.floor(float(lg.min())), -25) - 1
        hi = max(math.ceil(float(lg.max()) + math.log2(scale)), 17) + 1
        bins = list(range(lo, hi + 1))
        ax.hist(lg.numpy(), bins=bins, color="tab:blue", alpha=0.7, label="|grad| (fp32 backward)")
        if scale != 1.0:
            ax.hist(
                (lg + math.log2(scale)).numpy(),
                bins=bins,
                color="tab:green",
                alpha=0.5,
                label=f"|grad| x {scale:g} (loss scaling)",
            )
        _mark_fp16_range(ax, fp16)
        ax.text(
            0.01,
            0.95,
            f"bf16 smallest normal: 2^{math.log2(bf16.smallest_normal):.0f} (off the chart)",
            transform=ax.transAxes,
            fontsize=11,
            va="top",
        )
        ax.set_xlabel("log2 |activation gradient|")
        ax.set_ylabel("count (gradient values)")
        ax.set_title("Activation gradients of the tiny GPT (measured) vs the fp16 range", pad=26)
        ax.legend(loc="upper left", bbox_to_anchor=(0.0, 0.88), fontsize=10)
        fig.tight_layout()
    return fig


def plot_memory_by_mode(df: pd.DataFrame, *, unit: str = "MiB") -> Figure:
    """Predicted and measured bars per recipe, stacked by category (params, grads, optimizer,
    activations), with the measured peak marked. ``df``: ``training_memory()``."""
    require_columns(df, list(READS[ModeMemoryRow]), "df")
    div = {"KiB": 2**10, "MiB": 2**20}[unit]
    modes = list(dict.fromkeys(df["mode"]))
    cats = ["params", "grads", "optimizer", "activations"]
    with style():
        fig, ax = plt.subplots(figsize=(12, 5))
        for i, mode in enumerate(modes):
            sub = df[df["mode"] == mode].set_index("category")
            for j, col in enumerate(("predicted", "measured")):
                x = i * 3 + j
                bottom = 0.0
                for c in cats:
                    h = sub.loc[c, col] / div
                    ax.bar(
                        x,
                        h,
                        bottom=bottom,
                        color=CATEGORY_COLORS[c],
                        width=0.85,
                        hatch="//" if col == "predicted" else None,
                        edgecolor="white",
                        label=c if (i, j) == (0, 1) else None,
                    )
                    bottom += h
                if col == "measured":
                    ax.plot(
                        [x - 0.42, x + 0.42],
                        [sub.loc["peak", "measured"] / div] * 2,
                        color="black",
                        lw=2,
                        label="measured peak" if i == 0 else None,
                    )
        ax.set_xticks(
            [i * 3 + 0.5 for i in range(len(modes))], [f"{m}\n(pred | meas)" for m in modes]
        )
        ax.set_ylabel(unit)
        ax.set_title("One Adam step of the tiny GPT: predicted (hatched) vs measured")
        ax.legend(loc="upper right", fontsize=10)
        fig.tight_layout()
    return fig


def plot_matmul_speed(df: pd.DataFrame) -> Figure:
    """Throughput (GFLOP/s, log scale) per dtype and matrix size. ``df``: ``matmul_speed()``."""
    require_columns(df, list(READS[MatmulRow]), "df")
    sizes = sorted(set(df["n"]))
    dtypes = list(dict.fromkeys(df["dtype"]))
    colors = {"fp32": "tab:blue", "bf16": "tab:green", "fp16": "tab:orange"}
    with style():
        fig, ax = plt.subplots(figsize=(9, 4.5))
        w = 0.8 / len(dtypes)
        for j, dt in enumerate(dtypes):
            sub = df[df["dtype"] == dt].set_index("n")
            xs = [i + j * w for i in range(len(sizes))]
            ys = [float(sub.loc[n, "gflops"]) for n in sizes]
            bars = ax.bar(xs, ys, width=w, color=colors.get(dt, "gray"), label=dt)
            ax.bar_label(bars, [f"{y:,.0f}" if y >= 100 else f"{y:.2g}" for y in ys], padding=2)
        ax.set_yscale("log")
        # from the decade below the slowest bar (a labelled tick under every bar) to room above
        # the fastest bar for its value and the legend
        lo, hi = float(df["gflops"].min()), float(df["gflops"].max())
        ax.set_ylim(10 ** math.floor(math.log10(lo)), hi * 8)
        ax.set_xticks([i + 0.4 - w / 2 for i in range(len(sizes))], [f"{n}x{n}" for n in sizes])
        ax.set_ylabel("GFLOP/s (median)")
        ax.set_title("Matmul throughput per dtype on this machine")
        ax.legend(loc="upper left", ncol=len(dtypes))
        fig.tight_layout()
    return fig


def plot_loss_curves(df: pd.DataFrame) -> Figure:
    """Loss per step for each recipe (left) and fp16's loss scale with skipped steps (right).
    ``df``: ``loss_curves()``."""
    require_columns(df, list(READS[LossRow]), "df")
    with style():
        fig, (ax, ax2) = plt.subplots(1, 2, figsize=(13, 4.5), gridspec_kw={"width_ratios": [2, 1]})
        for mode, sub in df.groupby("mode", sort=False):
            ax.plot(sub["step"], sub["loss"], color=MODE_COLORS.get(mode), label=mode, lw=2)
        ax.set_xlabel("step")
        ax.set_ylabel("training loss (nats)")
        ax.set_title("Same run, four recipes")
        ax.legend()
        fp16 = df[df["mode"] == "fp16-mixed"]
        if len(fp16):
            ax2.plot(
                fp16["step"], fp16["scale"], color=MODE_COLORS["fp16-mixed"], drawstyle="steps-post"
            )
            skip = fp16[fp16["skipped"]]
            ax2.scatter(
                skip["step"], skip["scale"], color="black", zorder=3, label=f"skipped ({len(skip)})"
            )
            ax2.set_yscale("log", base=2)
            ax2.legend(fontsize=10)
        ax2.set_xlabel("step")
        ax2.set_ylabel("loss scale")
        ax2.set_title("GradScaler (fp16-mixed)")
        fig.tight_layout()
    return fig
