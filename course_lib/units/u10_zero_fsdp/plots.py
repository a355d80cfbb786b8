"""Unit 10's figures (notebooks/10_zero_fsdp.ipynb). Data in (what run.py returned), matplotlib
Figure out, drawn in the course style; nothing is measured here.
"""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from course_lib import kit, validate
from course_lib.units.u10_zero_fsdp.run import TimelineRow
from course_lib.units.u10_zero_fsdp.run_memory import CommRow, MemoryRow
from course_lib.viz.plots import require_columns, style

__all__ = ["plot_memory", "plot_comm", "plot_timeline", "plot_tradeoff", "plot_scale"]

_CATEGORY_COLOUR = {"params": "tab:blue", "grads": "tab:orange", "optimizer": "tab:green"}
_SPAN_COLOUR = {
    "all-gather": "tab:purple",
    "reduce-scatter": "tab:red",
    "all-reduce": "tab:red",
    "forward": "tab:blue",
    "backward": "tab:cyan",
}

READS = {
    MemoryRow: (
        "world_size",
        "rank",
        "stage",
        "params",
        "grads",
        "optimizer",
        "predicted",
        "paper",
    ),
    CommRow: ("world_size", "config", "wire_bytes", "predicted", "vs_ddp"),
    TimelineRow: ("rank", "config", "peak_bytes", "wire_bytes"),
}


def plot_memory(df: pd.DataFrame) -> Figure:
    """Model state per rank (rank 0, KiB) by stage and world size, measured (stacked bars:
    params, grads, optimizer), the padded-layout prediction (black tick) and the paper's
    formula without padding (grey dot); from ``memory_table``."""
    require_columns(df, list(READS[MemoryRow]), "df", nonempty=True)
    d = df[df["rank"] == 0].sort_values(["world_size", "stage"]).reset_index(drop=True)
    with style():
        fig, ax = plt.subplots(figsize=(10, 4.2))
        x = range(len(d))
        bottom = pd.Series(0.0, index=d.index)
        for cat, colour in _CATEGORY_COLOUR.items():
            ax.bar(x, d[cat] / 1024, bottom=bottom / 1024, color=colour, label=f"{cat} (measured)")
            bottom += d[cat]
        ax.scatter(
            x,
            d.predicted / 1024,
            marker="_",
            s=400,
            color="black",
            label="predicted (padded layout)",
            zorder=3,
        )
        ax.scatter(
            x,
            d.paper / 1024,
            marker="o",
            s=18,
            color="grey",
            label="paper formula (no padding)",
            zorder=4,
        )
        ax.set_xticks(list(x))
        ax.set_xticklabels([f"N={n}\nstage {s}" for n, s in zip(d.world_size, d.stage)], fontsize=8)
        ax.set_ylabel("KiB per rank")
        ax.set_title("Model state per rank: each stage shards one more thing")
        ax.legend(loc="upper right", fontsize=8)
        fig.tight_layout()
    return fig


def plot_comm(df: pd.DataFrame) -> Figure:
    """Bytes each rank wrote to its sockets per step (median over ranks) beside the prediction,
    as multiples of DDP's all-reduce; from ``comm_table``."""
    require_columns(df, list(READS[CommRow]), "df", nonempty=True)
    g = (
        df.dropna(subset=["wire_bytes"])
        .groupby(["world_size", "config"], as_index=False, sort=False)
        .agg(
            wire=("wire_bytes", "median"),
            predicted=("predicted", "first"),
            vs_ddp=("vs_ddp", "median"),
        )
    )
    g["ddp"] = g.wire / g.vs_ddp
    with style():
        fig, ax = plt.subplots(figsize=(10, 4.2))
        kit.bars_beside(
            ax,
            [f"N={n}\n{c}" for n, c in zip(g.world_size, g.config)],
            g.predicted / g.ddp,
            g.vs_ddp,
            color="tab:red",
            names=("predicted (ring collectives)", "measured: written to the sockets"),
            predicted_style={"color": "tab:grey"},
        )
        ax.axhline(1.0, color="black", lw=0.8, ls="--")
        plt.setp(ax.get_xticklabels(), fontsize=7, rotation=30, ha="right")
        ax.set_ylabel("bytes sent / DDP's all-reduce")
        ax.set_title("Traffic per step: stages 1-2 = DDP, stage 3 = 1.5 x DDP")
        ax.legend(loc="upper left", fontsize=8)
        fig.tight_layout()
    return fig


def _kind(name: str) -> str:
    return next((k for k in _SPAN_COLOUR if name.startswith(k)), "forward")


def _gantt(ax: Axes, ev: pd.DataFrame) -> None:
    """Two lanes per rank (compute, comm), one bar per span, in ms from the first event."""
    t0 = ev.start.min()
    ticks, labels, y = [], [], 0
    for rank in sorted(ev["rank"].unique()):
        for lane in ("compute", "comm"):
            one = ev[(ev["rank"] == rank) & (ev["lane"] == lane)]
            for s, e, name in zip(one.start, one.end, one.name):
                ax.barh(
                    y,
                    max((e - s) * 1e3, 0.02),
                    left=(s - t0) * 1e3,
                    height=0.8,
                    color=_SPAN_COLOUR[_kind(name)],
                    edgecolor="white",
                    lw=0.3,
                )
            ticks.append(y)
            labels.append(f"rank {rank} {lane}")
            y += 1
    ax.set_yticks(ticks)
    ax.set_yticklabels(labels, fontsize=11)
    ax.invert_yaxis()
    ax.grid(True, axis="x", alpha=0.3)


def plot_timeline(events: pd.DataFrame, configs: str | Sequence[str] | None = None) -> Figure:
    """Per-rank Gantt charts of one stage-3 step, one panel per configuration: forward and
    backward of each unit (compute lane), all-gathers and reduce-scatters (comm lane, from
    launch to completion); from ``fsdp_timeline``."""
    require_columns(
        events, ["rank", "name", "start", "end", "lane", "config"], "events", nonempty=True
    )
    valid = list(events["config"].unique())
    configs = valid if configs is None else validate.choices("configs", configs, valid)
    with style():
        fig, axes = plt.subplots(len(configs), 1, figsize=(11, 2.3 * len(configs)), squeeze=False)
        for ax, c in zip(axes[:, 0], configs):
            _gantt(ax, events[events["config"] == c])
            ax.set_title(c, fontsize=12)
        axes[-1, 0].set_xlabel("ms since the step's first event (shared host clock)")
        kinds = [k for k in _SPAN_COLOUR if any(_kind(n) == k for n in events["name"])]
        handles = [plt.Rectangle((0, 0), 1, 1, color=_SPAN_COLOUR[k]) for k in kinds]
        fig.suptitle(
            "Stage 3 (FSDP): gather before use, free after (each panel: its own time scale)"
        )
        fig.tight_layout(rect=(0, 0, 1, 0.92))
        fig.legend(
            handles,
            kinds,
            loc="lower center",
            ncol=len(kinds),
            fontsize=12,
            bbox_to_anchor=(0.5, 0.915),
            frameon=False,
        )
    return fig


def plot_tradeoff(summary: pd.DataFrame) -> Figure:
    """Peak memory against bytes sent per step (rank 0), one point per configuration; from
    ``fsdp_timeline``'s summary."""
    require_columns(summary, list(READS[TimelineRow]), "summary", nonempty=True)
    d = summary[summary["rank"] == 0]
    with style():
        fig, ax = plt.subplots(figsize=(6.5, 4))
        ax.scatter(d.wire_bytes / 1024, d.peak_bytes / 1024, s=60, color="tab:purple")
        for w, p, c in zip(d.wire_bytes, d.peak_bytes, d.config):
            ax.annotate(
                c, (w / 1024, p / 1024), textcoords="offset points", xytext=(6, 4), fontsize=8
            )
        ax.set_xlabel("KiB sent per step (measured)")
        ax.set_ylabel("peak tensor memory, KiB (MemoryMeter)")
        ax.set_title("reshard_after_forward: memory for communication")
        fig.tight_layout()
    return fig


def plot_scale(grid: pd.DataFrame, *, gpu_GB: float = 80.0) -> Figure:
    """GB of model state per GPU against data-parallel ranks, one line per stage (``scale_grid``),
    with a GPU's memory as a dashed line."""
    if not isinstance(grid, pd.DataFrame) or grid.empty:
        raise ValueError("grid: expected the non-empty DataFrame of run.scale_grid")
    ns = [int(c.split("=")[1]) for c in grid.columns]
    with style():
        fig, ax = plt.subplots(figsize=(6.5, 4))
        for stage, row in grid.iterrows():
            ax.plot(ns, row.values, "o-", label=stage)
        ax.axhline(gpu_GB, color="black", ls="--", lw=0.8, label=f"{gpu_GB:g} GB GPU")
        ax.set_xscale("log", base=2)
        ax.set_xticks(ns)
        ax.set_xticklabels([str(n) for n in ns])
        ax.set_xlabel("data-parallel ranks N")
        ax.set_ylabel("GB of model state per GPU")
        ax.set_title("7B, 16 B/param: what each stage leaves per GPU")
        ax.legend(fontsize=8)
        fig.tight_layout()
    return fig
