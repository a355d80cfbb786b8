"""Unit 16's figures (notebooks/16_mixture_of_experts.ipynb). Data in (what run.py returned),
matplotlib Figure out, drawn in the course style; nothing is measured here.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from course_lib.units.u16_mixture_of_experts.run import SpanRow, WireRow
from course_lib.units.u16_mixture_of_experts.run_train import TrainRow
from course_lib.viz.plots import require_columns, style

__all__ = ["plot_training", "plot_capacity", "plot_bytes", "plot_timeline"]

READS = {
    TrainRow: ("balancing", "step", "busiest_share", "task_loss", "capacity_factor", "dropped"),
    WireRow: ("ep", "rank", "predicted", "sent", "wire", "router", "capacity_factor"),
    SpanRow: ("hot", "rank", "phase", "start", "end", "rows", "repeat"),
}

_PHASE_COLORS = {
    "route": "tab:gray",
    "dispatch": "tab:orange",
    "experts": "tab:blue",
    "combine": "tab:red",
}


def plot_training(tr: pd.DataFrame) -> Figure:
    """The busiest expert's share of the assignments (left; 1/E = even, 1 = collapsed) and the
    task loss (right) against the step, one line per balancing method. From ``run.train``."""
    require_columns(tr, ["balancing", "step", "busiest_share", "task_loss"], "tr", nonempty=True)
    with style():
        fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.2))
        for name, part in tr.groupby("balancing", sort=False):
            smooth = part.busiest_share.rolling(10, min_periods=1).mean()
            a.plot(part.step, smooth, label=name)
            b.plot(part.step, part.task_loss.rolling(10, min_periods=1).mean(), label=name)
        a.axhline(0.25, color="black", lw=0.8, ls=":", label="even (1/4)")
        a.set_ylim(0, 1.05)
        a.set_xlabel("step")
        a.set_ylabel("busiest expert's share (mean of 10 steps)")
        a.legend(loc="center right")
        b.set_yscale("log")
        b.set_xlabel("step")
        b.set_ylabel("task loss (MSE, mean of 10 steps)")
        b.legend()
        fig.tight_layout()
    return fig


def plot_capacity(tr: pd.DataFrame) -> Figure:
    """Task loss against the step for each capacity factor, with the share dropped in the
    legend. From ``run.train(capacity_factors=...)``."""
    require_columns(tr, ["capacity_factor", "step", "task_loss", "dropped"], "tr", nonempty=True)
    with style():
        fig, ax = plt.subplots(figsize=(8, 4.2))
        for cf, part in tr.groupby(tr.capacity_factor.fillna(np.inf), sort=False):
            name = "no limit" if cf == np.inf else f"capacity factor {cf:g}"
            label = f"{name}: {part.dropped.mean():.0%} dropped over the run"
            ax.plot(part.step, part.task_loss.rolling(10, min_periods=1).mean(), label=label)
        ax.set_yscale("log")
        ax.set_xlabel("step")
        ax.set_ylabel("task loss (MSE, mean of 10 steps)")
        ax.legend()
        fig.tight_layout()
    return fig


def plot_bytes(wire: pd.DataFrame) -> Figure:
    """Bytes each rank sent for one MoE layer (forward + backward): predicted (bars), sent by
    the calls CommMeter saw (dots), measured on the wire (crosses). From ``run.wire_bytes``
    (the first capacity setting)."""
    require_columns(wire, ["ep", "rank", "predicted", "sent", "wire"], "wire", nonempty=True)
    first = wire[(wire.router == wire.router.iloc[0]) & wire.capacity_factor.isna()]
    df = first.groupby(["ep", "rank"])[["predicted", "sent"]].sum()
    measured = first.groupby(["ep", "rank"])["wire"].sum(min_count=1)
    x = np.arange(len(df))
    with style():
        fig, ax = plt.subplots(figsize=(9, 4.2))
        ax.bar(x, df.predicted / 1024, color="tab:gray", alpha=0.6, label="predicted (estimate)")
        ax.plot(x, df.sent / 1024, "o", color="tab:blue", label="sent (calls CommMeter saw)")
        ax.plot(x, measured / 1024, "x", color="tab:red", ms=9, label="wire (measured by the OS)")
        ax.set_xticks(x, [f"ep {e}\nrank {r}" for e, r in df.index])
        ax.set_ylabel("KiB per rank, forward + backward")
        ax.legend(loc="upper left")
        fig.tight_layout()
    return fig


def plot_timeline(tl: pd.DataFrame, *, repeat: int | None = None) -> Figure:
    """One MoE layer's forward on every rank, one panel per hot setting: route, dispatch,
    experts (labelled with the rows computed) and combine. From ``run.timeline`` (one repeat:
    the last unless given)."""
    require_columns(tl, ["hot", "rank", "phase", "start", "end", "rows"], "tl", nonempty=True)
    rep = int(tl.repeat.max()) if repeat is None else int(repeat)
    tl = tl[tl.repeat == rep]
    hots = list(dict.fromkeys(tl.hot))
    ranks = int(tl["rank"].max()) + 1
    with style():
        fig, axes = plt.subplots(len(hots), 1, figsize=(11, 1.4 + 0.9 * ranks * len(hots)))
        axes = np.atleast_1d(axes)
        for ax, hot in zip(axes, hots):
            for row in tl[tl.hot == hot].itertuples():
                width = (row.end - row.start) * 1e3
                ax.barh(row.rank, width, left=row.start * 1e3, color=_PHASE_COLORS[row.phase],
                        edgecolor="black", linewidth=0.3)  # fmt: skip
                if row.phase == "experts":
                    ax.text(row.start * 1e3, row.rank, f" {row.rows} rows", va="center",
                            fontsize=9)  # fmt: skip
            ax.set_yticks(range(ranks), [f"rank {r}" for r in range(ranks)])
            ax.invert_yaxis()
            what = "routing as it comes" if hot == 0 else "one hot expert on rank 0"
            ax.set_title(f"{what}: route (grey), dispatch (orange), experts (blue), combine (red)")
        axes[-1].set_xlabel("milliseconds after the barrier (this machine's clock)")
        fig.tight_layout()
    return fig
