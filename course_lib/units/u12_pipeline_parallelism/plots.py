"""Unit 12's figures (notebooks/12_pipeline_parallelism.ipynb). Data in (what run.py returned),
matplotlib Figure out, drawn in the course style; nothing is measured here.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from course_lib.units.u12_pipeline_parallelism.run import BubbleRow
from course_lib.units.u12_pipeline_parallelism.run_costs import ActivationRow
from course_lib.viz.plots import require_columns, style

__all__ = ["plot_gantt", "plot_bubble", "plot_memory"]

READS = {
    ActivationRow: ("schedule", "stage", "measured_mb", "predicted"),
    BubbleRow: ("schedule", "virtual", "measured", "min_rank", "max_rank", "replayed", "predicted"),
}


def _gantt(ax: Axes, ev: pd.DataFrame, title: str, n_chunks: int) -> None:
    cmap = plt.get_cmap("tab20")
    compute = ev[ev["lane"] == "compute"]
    ranks = sorted(compute["rank"].unique())
    span = float(compute["end"].max() - compute["start"].min())
    for _, e in compute.iterrows():
        y = ranks.index(e["rank"])
        chunk = int(e["stage"]) // len(ranks)
        colour = cmap(2 * (int(e["mb"]) % 10) + (e["kind"] == "B"))
        ax.barh(
            y,
            (e["end"] - e["start"]) * 1e3,
            left=e["start"] * 1e3,
            height=0.8,
            color=colour,
            edgecolor="black" if chunk else "white",
            hatch="//" if chunk else None,
            linewidth=0.5,
        )
        if e["end"] - e["start"] >= 0.035 * span:  # a label only where it fits at a readable size
            ax.text(
                (e["start"] + e["end"]) / 2 * 1e3,
                y,
                f"{e['kind']}{int(e['mb'])}",
                ha="center",
                va="center",
                fontsize=10,
                clip_on=True,
            )
    ax.set_yticks(range(len(ranks)))
    ax.set_yticklabels([f"rank {r}" for r in ranks])
    ax.invert_yaxis()
    ax.set_title(title, fontsize=12)
    ax.grid(True, axis="x", alpha=0.3)


def plot_gantt(events: pd.DataFrame, bubbles: pd.DataFrame | None = None) -> Figure:
    """Every rank's forwards (light) and backwards (dark) of one step, one panel per schedule,
    on the shared host clock (``run.timelines``); gaps are the bubble. Interleaved: the second
    chunk of stages is hatched. ``bubbles`` (``run.bubble_table``) adds the idle fractions."""
    require_columns(
        events,
        ["rank", "lane", "start", "end", "stage", "mb", "kind", "schedule", "virtual"],
        "events",
        nonempty=True,
    )
    keys = list(dict.fromkeys(zip(events["schedule"], events["virtual"])))
    with style():
        fig, axes = plt.subplots(len(keys), 1, figsize=(11, 2.1 * len(keys) + 0.6), squeeze=False)
        for ax, (s, v) in zip(axes[:, 0], keys):
            ev = events[(events["schedule"] == s) & (events["virtual"] == v)]
            ev = ev[ev["repeat"] == ev["repeat"].min()]
            title = s + (f" (v = {v})" if v > 1 else "")
            if bubbles is not None:
                b = bubbles[(bubbles["schedule"] == s) & (bubbles["virtual"] == v)].iloc[0]
                title += (
                    f": idle {b['measured']:.0%} measured, {b['predicted']:.0%} predicted, "
                    f"{b['replayed']:.0%} replayed on ideal hardware"
                )
            _gantt(ax, ev, title, v)
        axes[-1, 0].set_xlabel("ms since the step's first event (shared host clock)")
        fig.tight_layout()
    return fig


def plot_bubble(table: pd.DataFrame) -> Figure:
    """Idle fraction per schedule: measured on the ranks' timelines (bar: mean, whiskers: min
    and max over ranks), replayed on ideal hardware, and predicted by estimate."""
    require_columns(table, list(READS[BubbleRow]), "table", nonempty=True)
    labels = [s + (f" v={v}" if v > 1 else "") for s, v in zip(table.schedule, table.virtual)]
    x = range(len(table))
    with style():
        fig, ax = plt.subplots(figsize=(8, 3.8))
        ax.bar(
            [i - 0.27 for i in x],
            table.measured,
            0.27,
            color="tab:red",
            yerr=[table.measured - table.min_rank, table.max_rank - table.measured],
            capsize=3,
            label="measured (idle on each rank's timeline)",
        )
        ax.bar(
            list(x),
            table.replayed,
            0.27,
            color="tab:blue",
            label="recorded order, replayed on ideal hardware",
        )
        ax.bar(
            [i + 0.27 for i in x],
            table.predicted,
            0.27,
            color="tab:grey",
            label="predicted (p-1)/(v·m+p-1); naive (p-1)/p",
        )
        ax.set_xticks(list(x))
        ax.set_xticklabels(labels)
        ax.set_ylabel("fraction of the step idle")
        ax.set_ylim(0, 1)
        ax.legend(loc="upper right", fontsize=8)
        ax.set_title("The bubble: measured, replayed, predicted")
        fig.tight_layout()
    return fig


def plot_memory(df: pd.DataFrame) -> Figure:
    """Peak activations of each stage in micro-batches' worth (MemoryMeter's peak over one
    micro-batch measured alone) beside the prediction, per schedule (``run.activation_memory``)."""
    require_columns(df, list(READS[ActivationRow]), "df", nonempty=True)
    schedules = list(dict.fromkeys(df.schedule))
    with style():
        fig, ax = plt.subplots(figsize=(8, 3.6))
        width = 0.8 / len(schedules)
        for j, (s, colour) in enumerate(zip(schedules, ["tab:orange", "tab:green", "tab:blue"])):
            g = df[df.schedule == s]
            xs = [st + (j - (len(schedules) - 1) / 2) * width for st in g.stage]
            ax.bar(xs, g.measured_mb, width, color=colour, label=f"{s} measured")
            ax.scatter(xs, g.predicted, color="black", marker="_", s=300, zorder=3)
        ax.scatter([], [], color="black", marker="_", s=200, label="predicted (GPipe m, 1F1B p-s)")
        ax.set_xticks(sorted(df.stage.unique()))
        ax.set_xlabel("stage")
        ax.set_ylabel("peak activations / one micro-batch's")
        ax.legend(fontsize=8)
        ax.set_title("Activation memory per stage")
        fig.tight_layout()
    return fig
