"""Unit 15's figures (notebooks/15_context_parallelism.ipynb). Data in (what run.py returned),
matplotlib Figure out, drawn in the course style; nothing is measured here.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from course_lib.units.u15_context_parallelism.run import LayoutRow, SpanRow, WireRow
from course_lib.units.u15_context_parallelism.run_memory import SavedRow
from course_lib.units.u15_context_parallelism.run_scale import ScaleRow
from course_lib.viz.plots import require_columns, style

__all__ = ["plot_layouts", "plot_timeline", "plot_bytes", "plot_saved", "plot_scale"]

READS = {
    LayoutRow: ("layout", "rank", "tokens", "causal_blocks"),
    SpanRow: ("layout", "rank", "phase", "kind", "start", "end", "repeat"),
    WireRow: ("cp", "method", "layout", "predicted", "sent", "wire"),
    SavedRow: ("seq", "kind", "measured", "predicted"),
    ScaleRow: ("seq", "cp", "act_flash_GiB", "act_flash_allgather_GiB", "act_no_flash_GiB",
               "ring_MiB", "allgather_MiB", "ulysses_MiB"),
}  # fmt: skip

_KIND_COLORS = {"compute": "tab:blue", "wait": "tab:orange"}


def plot_layouts(layouts: pd.DataFrame) -> Figure:
    """The causal score matrix of the whole sequence, each query row coloured by the rank that
    owns it: contiguous (left) and zigzag (right). From ``run.layouts``."""
    require_columns(layouts, ["layout", "rank", "tokens"], "layouts", nonempty=True)
    names = list(dict.fromkeys(layouts.layout))
    with style():
        fig, axes = plt.subplots(1, len(names), figsize=(5.5 * len(names), 4.6), squeeze=False)
        for ax, lay in zip(axes[0], names):
            part = layouts[layouts.layout == lay]
            seq = sum(len(t) for t in part.tokens)
            img = np.full((seq, seq), np.nan)
            for rank, tokens in zip(part["rank"], part.tokens):
                for t in tokens:
                    img[t, : t + 1] = rank  # row t: the keys query t may see
            ax.imshow(img, cmap="tab10", vmin=0, vmax=9, interpolation="nearest")
            counts = ", ".join(f"r{r}: {b}" for r, b in zip(part["rank"], part.causal_blocks))
            ax.set_title(f"{lay}\ncausal blocks per rank: {counts}")
            ax.set_xlabel("key position")
            ax.set_ylabel("query position (colour = rank)")
        fig.tight_layout()
    return fig


def plot_timeline(tl: pd.DataFrame, *, repeat: int | None = None) -> Figure:
    """Ring attention's forward and backward on every rank, one panel per layout: compute spans
    (blue, labelled with the blocks computed) and waits for K/V or dK/dV (orange). Times from
    ``run.timeline`` (one repeat: the first unless given)."""
    require_columns(tl, ["layout", "rank", "phase", "kind", "start", "end"], "tl", nonempty=True)
    rep = int(tl.repeat.min()) if repeat is None else int(repeat)
    tl = tl[tl.repeat == rep]
    names = list(dict.fromkeys(tl.layout))
    ranks = int(tl["rank"].max()) + 1
    with style():
        fig, axes = plt.subplots(len(names), 1, figsize=(11, 1.2 + 0.8 * ranks * len(names)))
        axes = np.atleast_1d(axes)
        for ax, lay in zip(axes, names):
            part = tl[tl.layout == lay]
            for row in part.itertuples():
                y = row.rank
                ax.barh(
                    y,
                    (row.end - row.start) * 1e3,
                    left=row.start * 1e3,
                    color=_KIND_COLORS[row.kind],
                    alpha=0.9 if row.phase == "forward" else 0.55,
                    edgecolor="black",
                    linewidth=0.3,
                )
            ax.set_yticks(range(ranks), [f"rank {r}" for r in range(ranks)])
            ax.invert_yaxis()
            ax.set_title(f"{lay}: compute (blue; darker = forward) and waits (orange)")
        axes[-1].set_xlabel("milliseconds after the barrier (this machine's clock)")
        fig.tight_layout()
    return fig


def plot_bytes(wire: pd.DataFrame) -> Figure:
    """Bytes rank 0 sent per attention layer (forward + backward) by method and cp: predicted
    (bars), sent by the calls CommMeter saw (dots) and measured on the wire (crosses). From
    ``run.wire_bytes``."""
    require_columns(wire, ["cp", "method", "layout", "predicted", "sent"], "wire", nonempty=True)
    df = wire.groupby(["cp", "method", "layout"], sort=False)[["predicted", "sent"]].sum()
    measured = wire.groupby(["cp", "method", "layout"], sort=False)["wire"].sum(min_count=1)
    labels = [f"{m}\n{lay[:6]}\ncp {c}" for c, m, lay in df.index]
    x = np.arange(len(df))
    with style():
        fig, ax = plt.subplots(figsize=(11, 4.4))
        ax.bar(x, df.predicted / 1024, color="tab:gray", alpha=0.6, label="predicted (estimate)")
        ax.plot(x, df.sent / 1024, "o", color="tab:blue", label="sent (calls CommMeter saw)")
        ax.plot(x, measured / 1024, "x", color="tab:red", ms=9, label="wire (measured by the OS)")
        ax.set_xticks(x, labels)
        ax.set_ylabel("KiB per rank, forward + backward")
        # above the axes: inside, the legend covered the first bars
        ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=3, frameon=False)
        fig.tight_layout()
    return fig


def plot_saved(saved: pd.DataFrame) -> Figure:
    """Bytes attention keeps for backward against the sequence length, log-log: measured
    (markers) and predicted (lines) for each kind. From ``run.saved_bytes``."""
    require_columns(saved, ["seq", "kind", "measured", "predicted"], "saved", nonempty=True)
    with style():
        fig, ax = plt.subplots(figsize=(8, 4.4))
        for kind, part in saved.groupby("kind", sort=False):
            (line,) = ax.plot(part.seq, part.predicted / 1024, "-", label=f"{kind}: predicted")
            ax.plot(part.seq, part.measured / 1024, "o", color=line.get_color(), label="measured")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("tokens in the sequence (s)")
        ax.set_ylabel("KiB kept for backward, per rank")
        ax.legend(fontsize=10)
        fig.tight_layout()
    return fig


def plot_scale(scale: pd.DataFrame) -> Figure:
    """Llama 3 405B, one layer on one GPU: activations (left, GiB) and bytes sent per layer
    (right, MiB) for each (seq, cp). From ``run.llama3_scale``."""
    require_columns(scale, ["seq", "cp", "act_flash_GiB"], "scale", nonempty=True)
    labels = [f"{s // 1024}K\ncp {c}" for s, c in zip(scale.seq, scale.cp)]
    x = np.arange(len(scale))
    with style():
        fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.4))
        w = 0.27
        for i, (col, label) in enumerate(
            (
                ("act_flash_GiB", "FlashAttention: no score matrix (ring, Ulysses)"),
                ("act_flash_allgather_GiB", "+ the gathered K/V (all-gather)"),
                ("act_no_flash_GiB", "no FlashAttention: local softmax kept"),
            )
        ):
            a.bar(x + (i - 1) * w, scale[col], w, label=label)
        a.set_yscale("log")
        a.set_ylim(top=a.get_ylim()[1] * 100)  # room for the legend above the bars
        a.set_xticks(x, labels)
        a.set_ylabel("GiB per GPU, one layer")
        a.legend(fontsize=10, loc="upper left")
        for i, m in enumerate(("ring", "allgather", "ulysses")):
            vals = scale[f"{m}_MiB"].astype(float)
            b.bar(x + (i - 1) * w, vals.fillna(0), w, label=m)
            for xi, v in zip(x, vals):
                if v != v:  # NaN: the heads do not split
                    b.text(
                        xi + (i - 1) * w, 2, "Ulysses:\nn/a", ha="center", va="bottom", fontsize=10
                    )
        b.set_xticks(x, labels)
        b.set_ylabel("MiB sent per GPU, one layer (fwd + bwd)")
        b.legend()
        fig.tight_layout()
    return fig
