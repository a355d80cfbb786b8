"""Plots of unit 13 (notebooks/13_interconnects_and_backends.ipynb): results -> matplotlib Figure.

Pure functions over the DataFrames of course_lib.units.u13_interconnects_and_backends.run; nothing is
measured here. Bandwidths in GB/s (1e9 bytes/s), sizes labelled in KiB/MiB (1024-based).
"""

from __future__ import annotations

from collections.abc import Iterable

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from course_lib.measure.estimate import fmt_bytes
from course_lib.units.u13_interconnects_and_backends.run import GradientRow
from course_lib.units.u13_interconnects_and_backends.run_sweep import FitRow, SweepRow
from course_lib.viz.plots import require_columns, styled

__all__ = ["plot_sweep", "plot_link_times"]

READS = {
    SweepRow: ("collective", "world_size", "size_bytes", "time_s", "busbw_GBps", "backend"),
    GradientRow: ("n_params", "link", "time_s", "grad_bytes"),
    FitRow: ("collective", "world_size", "alpha_s", "beta_s_per_byte"),
}

_COLORS = {"all_reduce": "tab:blue", "all_gather": "tab:orange", "reduce_scatter": "tab:green"}
_STYLES = ["-", "--", ":", "-."]


def _size_axis(ax: Axes, sizes: Iterable[float]) -> None:
    ax.set_xscale("log", base=2)
    ticks = sorted(set(int(s) for s in sizes))
    step = max(1, -(-len(ticks) // 4))  # at most 4 labels: readable size without overlapping
    ax.set_xticks(ticks[::step])
    ax.set_xticklabels([fmt_bytes(t, digits=0) for t in ticks[::step]])
    ax.set_xlabel("message size (full buffer)")


def _memcpy_label(ceiling_GBps: float) -> str:
    return f"single-thread memcpy {ceiling_GBps:.1f} GB/s"


def _plot_one_series(
    ax_t: Axes, ax_b: Axes, g: pd.DataFrame, coll: str, i_ws: int, fits: pd.DataFrame | None
) -> None:
    """One (collective, world size): time per call (measured, and the fit) and busbw."""
    ws = g["world_size"].iloc[0]
    color = _COLORS.get(coll, "tab:gray")
    ls = _STYLES[i_ws % len(_STYLES)]
    label = f"{coll}, {ws} ranks"
    mfc = "none" if i_ws else color
    ax_t.plot(
        g["size_bytes"],
        g["time_s"] * 1e3,
        "o",
        color=color,
        ms=5,
        mfc=mfc,
        label=f"{label} measured",
    )
    if fits is not None:
        f = fits[(fits["collective"] == coll) & (fits["world_size"] == ws)]
        if len(f):
            xs = np.geomspace(g["size_bytes"].min(), g["size_bytes"].max(), 100)
            pred = f["alpha_s"].iloc[0] + f["beta_s_per_byte"].iloc[0] * xs
            ax_t.plot(
                xs,
                np.clip(pred, 1e-9, None) * 1e3,
                ls,
                color=color,
                lw=1.4,
                label=f"{label} alpha-beta fit",
            )
    ax_b.plot(
        g["size_bytes"], g["busbw_GBps"], ls, marker="o", ms=4, color=color, mfc=mfc, label=label
    )


def _sweep_legend(
    collectives: list[str], world_sizes: list[int], with_fits: bool, ceiling_GBps: float | None
) -> list[Line2D]:
    """One legend for both panels, below them (no entry hides a point): colour = collective,
    line style and filled/hollow marker = world size."""
    handles = [Line2D([], [], color=_COLORS.get(c, "tab:gray"), lw=4, label=c) for c in collectives]
    handles += [
        Line2D(
            [],
            [],
            color="black",
            ls=_STYLES[i % len(_STYLES)],
            marker="o",
            mfc="black" if i == 0 else "none",
            label=f"{ws} ranks",
        )
        for i, ws in enumerate(world_sizes)
    ]
    if with_fits:
        handles += [
            Line2D([], [], color="gray", marker="o", ls="none", label="left: measured"),
            Line2D([], [], color="gray", label="left: alpha-beta fit"),
        ]
    if ceiling_GBps is not None:
        handles.append(
            Line2D([], [], color="black", ls="--", lw=1, label=_memcpy_label(ceiling_GBps))
        )
    return handles


@styled
def plot_sweep(
    df: pd.DataFrame,
    fits: pd.DataFrame | None = None,
    *,
    ceiling_GBps: float | None = None,
    title: str | None = None,
) -> Figure:
    """Left: time per call against size, measured (points) beside the fitted alpha-beta line.
    Right: bus bandwidth (nccl-tests busbw) against size, with the single-thread memcpy ceiling.
    One colour per collective, one line style per world size."""
    require_columns(
        df, ["collective", "world_size", "size_bytes", "time_s", "busbw_GBps"], "df", nonempty=True
    )
    if fits is not None:
        require_columns(fits, list(READS[FitRow]), "fits", nonempty=True)
    fig, (ax_t, ax_b) = plt.subplots(1, 2, figsize=(12, 6.2))
    world_sizes = sorted(df["world_size"].unique())
    collectives = list(dict.fromkeys(df["collective"]))
    for (coll, ws), g in df.groupby(["collective", "world_size"], sort=False):
        _plot_one_series(ax_t, ax_b, g.sort_values("size_bytes"), coll, world_sizes.index(ws), fits)
    if ceiling_GBps is not None:
        ax_b.axhline(ceiling_GBps, color="black", ls="--", lw=1, label=_memcpy_label(ceiling_GBps))
    ax_t.set_yscale("log")
    ax_t.set_ylabel("time per call (ms, median)")
    ax_t.set_title("time per call")
    ax_b.set_yscale("log")
    ax_b.set_ylabel("bus bandwidth (GB/s)")
    ax_b.set_title("busbw (nccl-tests convention)")
    for ax in (ax_t, ax_b):
        _size_axis(ax, df["size_bytes"])
        ax.grid(True, which="both", alpha=0.3)
    handles = _sweep_legend(collectives, world_sizes, fits is not None, ceiling_GBps)
    backend = ", ".join(sorted(df["backend"].unique())) if "backend" in df else ""
    fig.suptitle(title or f"collective sweep ({backend})" if backend else "collective sweep")
    rows = -(-len(handles) // 4)
    fig.tight_layout(rect=(0, 0.065 * rows, 1, 1))
    fig.legend(
        handles=handles, loc="lower center", ncol=4, bbox_to_anchor=(0.5, 0.0), frameon=False
    )
    return fig


@styled
def plot_link_times(table: pd.DataFrame, *, title: str | None = None) -> Figure:
    """Predicted ring all-reduce time of one step's gradients per link and model (log scale),
    from run.gradient_allreduce_table."""
    require_columns(table, ["n_params", "link", "time_s"], "table", nonempty=True)
    models = sorted(table["n_params"].unique())
    links = list(dict.fromkeys(table["link"]))
    y = np.arange(len(links))
    height = 0.8 / len(models)
    fig, ax = plt.subplots(figsize=(9, 0.55 * len(links) + 2.2))
    for i, n in enumerate(models):
        g = table[table["n_params"] == n].set_index("link").loc[links]
        bars = ax.barh(
            y + i * height,
            g["time_s"] * 1e3,
            height=height,
            label=f"{n / 1e9:g}B params ({fmt_bytes(int(g['grad_bytes'].iloc[0]), 'GB', digits=0)} of gradients)"
            if "grad_bytes" in g
            else f"{n / 1e9:g}B params",
        )
        for bar, t in zip(bars, g["time_s"]):
            ms = t * 1e3
            ax.text(
                bar.get_width(),
                bar.get_y() + bar.get_height() / 2,
                f" {ms:,.0f} ms" if ms >= 100 else f" {ms:.3g} ms",
                va="center",
            )
    ax.set_yticks(y + height * (len(models) - 1) / 2)
    ax.set_yticklabels(links)
    ax.set_xscale("log")
    ax.set_xlim(right=float(table["time_s"].max()) * 1e3 * 4)  # room for the labels
    ax.set_xlabel("predicted ring all-reduce time (ms, log scale), at the per-direction GB/s")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2)
    ax.set_title(title or "gradient all-reduce per step, by link (estimate)")
    fig.tight_layout()
    return fig
