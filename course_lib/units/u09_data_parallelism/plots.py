"""Unit 09's figures (notebooks/09_data_parallelism.ipynb). Data in (what run.py returned),
matplotlib Figure out, drawn in the course style; nothing is measured here.
"""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from course_lib import kit, validate
from course_lib.units.u09_data_parallelism.run import StragglerRow
from course_lib.units.u09_data_parallelism.run_traffic import BytesRow
from course_lib.viz.plots import require_columns, style

__all__ = ["plot_overlap", "plot_bytes", "plot_straggler", "plot_sweep"]

READS = {
    BytesRow: ("world_size", "version", "wire_bytes", "predicted", "all_reduce_calls"),
    StragglerRow: ("rank", "slow", "compute_s", "step_s"),
}

_LANE_COLOUR = {"compute": "tab:blue", "comm": "tab:red"}


def _sub_lanes(spans: list[tuple[float, float]]) -> list[int]:
    """A row for each (start, end) span so that spans in flight together never share a row."""
    ends: list[float] = []  # end of the last span in each row
    rows = []
    for start, end in spans:
        row = next((i for i, e in enumerate(ends) if e <= start), len(ends))
        if row == len(ends):
            ends.append(end)
        ends[row] = end
        rows.append(row)
    return rows


def _gantt(ax: Axes, events: pd.DataFrame, title: str) -> None:
    y, ticks, labels = 0.0, [], []
    for rank in sorted(events["rank"].unique()):
        for lane in ("compute", "comm"):
            ev = events[(events["rank"] == rank) & (events["lane"] == lane)].sort_values("start")
            spans = [(s * 1e3, e * 1e3) for s, e in zip(ev["start"], ev["end"])]
            rows = _sub_lanes(spans) if lane == "comm" else [0] * len(spans)
            for (s, e), r, name in zip(spans, rows, ev["name"]):
                ax.barh(
                    y + r,
                    max(e - s, 1e-3),
                    left=s,
                    height=0.8,
                    color=_LANE_COLOUR[lane],
                    alpha=0.85,
                    edgecolor="white",
                )
                if lane == "comm":
                    ax.text(
                        (s + e) / 2,
                        y + r,
                        name.replace("bucket ", "b"),
                        ha="center",
                        va="center",
                        fontsize=8,
                        color="white",
                        clip_on=True,
                    )
            n = max(rows, default=0) + 1
            ticks.append(y + (n - 1) / 2)
            labels.append(f"rank {rank} {'backward' if lane == 'compute' else 'all-reduce'}")
            y += n + 0.4
    ax.set_yticks(ticks)
    ax.set_yticklabels(labels)
    ax.invert_yaxis()
    ax.set_xlabel("ms since the step's first backward event (shared host clock)")
    ax.set_title(title)
    ax.grid(True, axis="x", alpha=0.3)


def plot_overlap(
    events: pd.DataFrame,
    *,
    implementation: str = "course",
    bucket_caps_mb: Sequence[float] | None = None,
) -> Figure:
    """Per-rank Gantt charts of one step, one panel per bucket cap: each layer's backward (blue)
    and each bucket's all-reduce (red, from launch to completion; buckets in flight together get
    their own row), from ``ddp_bucket_sweep(...).events``."""
    require_columns(
        events,
        ["rank", "lane", "name", "start", "end", "bucket_cap_mb", "implementation"],
        "events",
        nonempty=True,
    )
    ev = events[events["implementation"] == implementation]
    if ev.empty:
        raise ValueError(
            f"implementation = {implementation!r}: expected one of "
            f"{sorted(events['implementation'].unique())}"
        )
    valid = sorted(ev["bucket_cap_mb"].unique())
    caps = (
        valid
        if bucket_caps_mb is None
        else validate.choices("bucket_caps_mb", bucket_caps_mb, valid)
    )
    with style():
        fig, axes = plt.subplots(1, len(caps), figsize=(6.5 * len(caps), 4.2), squeeze=False)
        for ax, cap in zip(axes[0], caps):
            one = ev[ev["bucket_cap_mb"] == cap]
            n = one[(one["lane"] == "comm") & (one["rank"] == one["rank"].min())].shape[0]
            _gantt(ax, one, f"bucket_cap_mb = {cap:g}: {n} bucket(s)")
        fig.suptitle(f"DataParallel ({implementation}): all-reduces run while backward goes on")
        fig.tight_layout()
    return fig


def plot_bytes(df: pd.DataFrame) -> Figure:
    """Bytes each rank put on the wire per step (measured, median over ranks) beside the ring's
    2(N-1)/N x gradient bytes, per world size and version (``bytes_per_step``)."""
    require_columns(df, list(READS[BytesRow]), "df", nonempty=True)
    g = df.groupby(["world_size", "version"], as_index=False).agg(
        wire=("wire_bytes", "median"),
        predicted=("predicted", "first"),
        calls=("all_reduce_calls", "first"),
    )
    labels = [f"N={n}\n{v} ({c} calls)" for n, v, c in zip(g.world_size, g.version, g.calls)]
    with style():
        fig, ax = plt.subplots(figsize=(8, 4))
        kit.bars_beside(
            ax,
            labels,
            g.predicted,
            g.wire,
            color="tab:red",
            scale=1024,
            names=("predicted: 2(N-1)/N x gradient bytes", "measured: written to the sockets"),
            predicted_style={"color": "tab:grey"},
        )
        ax.set_ylabel("KiB per rank per step")
        ax.set_title("Gradient all-reduce: bytes each rank sends")
        ax.legend(loc="upper left")
        fig.tight_layout()
    return fig


def plot_straggler(df: pd.DataFrame) -> Figure:
    """Every rank's step time split into its own compute and the wait inside the all-reduce
    (``straggler``, medians over steps, ms)."""
    require_columns(df, list(READS[StragglerRow]), "df", nonempty=True)
    g = df.groupby("rank", as_index=False)[["compute_s", "step_s"]].median()
    with style():
        fig, ax = plt.subplots(figsize=(7, 3.5))
        ax.bar(g["rank"], g.compute_s * 1e3, color="tab:blue", label="own forward (+ sleep)")
        ax.bar(
            g["rank"],
            (g.step_s - g.compute_s) * 1e3,
            bottom=g.compute_s * 1e3,
            color="tab:orange",
            label="backward + all-reduce (waits for the slowest)",
        )
        ax.set_xticks(g["rank"])
        ax.set_xlabel("rank")
        ax.set_ylabel("ms per step (median)")
        ax.set_title("One slow rank makes every rank slow")
        ax.legend(loc="lower right")
        fig.tight_layout()
    return fig


def plot_sweep(summary: pd.DataFrame) -> Figure:
    """Buckets per step and step time against bucket_cap_mb, ours beside torch's DDP."""
    require_columns(
        summary,
        ["implementation", "bucket_cap_mb", "n_buckets", "step_ms"],
        "summary",
        nonempty=True,
    )
    with style():
        fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8))
        for impl, g in summary.groupby("implementation"):
            g = g.sort_values("bucket_cap_mb")
            a.plot(g.bucket_cap_mb, g.n_buckets, "o-", label=impl)
            b.plot(g.bucket_cap_mb, g.step_ms, "o-", label=impl)
        for ax in (a, b):
            ax.set_xscale("log")
            ax.set_xlabel("bucket_cap_mb (MiB)")
            ax.legend()
        a.set_ylabel("all-reduce calls per step")
        b.set_ylabel("step time, ms (this machine, noisy)")
        fig.suptitle("Bucket size: ours and torch's DDP")
        fig.tight_layout()
    return fig
