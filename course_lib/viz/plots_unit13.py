"""Plots of unit 13 (notebooks/13_interconnects_and_backends.ipynb): results -> matplotlib Figure.

Pure functions over the DataFrames of course_lib.experiments.unit13_interconnects; nothing is
measured here. Bandwidths in GB/s (1e9 bytes/s), sizes labelled in KiB/MiB (1024-based).
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from course_lib.measure.estimate import fmt_bytes
from course_lib.viz.plots import require_columns

__all__ = ["plot_sweep", "plot_link_times", "plot_ddp_timeline", "plot_bucket_sweep"]

_COLORS = {"all_reduce": "tab:blue", "all_gather": "tab:orange", "reduce_scatter": "tab:green"}
_STYLES = ["-", "--", ":", "-."]


def _size_axis(ax, sizes) -> None:
    ax.set_xscale("log", base=2)
    ticks = sorted(set(int(s) for s in sizes))
    step = max(1, len(ticks) // 6)
    ax.set_xticks(ticks[::step])
    ax.set_xticklabels([fmt_bytes(t, digits=0) for t in ticks[::step]], fontsize=8)
    ax.set_xlabel("message size (full buffer)")


def plot_sweep(df: pd.DataFrame, fits: pd.DataFrame | None = None, *,
               ceiling_GBps: float | None = None, title: str | None = None):
    """Left: time per call against size, measured (points) beside the fitted alpha-beta line.
    Right: bus bandwidth (nccl-tests busbw) against size, with the single-thread memcpy ceiling.
    One colour per collective, one line style per world size."""
    require_columns(df, ["collective", "world_size", "size_bytes", "time_s", "busbw_GBps"], "df", nonempty=True)
    if fits is not None:
        require_columns(fits, ["collective", "world_size", "alpha_s", "beta_s_per_byte"], "fits", nonempty=True)
    fig, (ax_t, ax_b) = plt.subplots(1, 2, figsize=(11, 4.2))
    world_sizes = sorted(df["world_size"].unique())
    for (coll, ws), g in df.groupby(["collective", "world_size"], sort=False):
        g = g.sort_values("size_bytes")
        color = _COLORS.get(coll, "tab:gray")
        ls = _STYLES[world_sizes.index(ws) % len(_STYLES)]
        label = f"{coll}, {ws} ranks"
        ax_t.plot(g["size_bytes"], g["time_s"] * 1e3, "o", color=color, ms=4,
                  mfc="none" if world_sizes.index(ws) else color, label=f"{label} measured")
        if fits is not None:
            f = fits[(fits["collective"] == coll) & (fits["world_size"] == ws)]
            if len(f):
                xs = np.geomspace(g["size_bytes"].min(), g["size_bytes"].max(), 100)
                pred = f["alpha_s"].iloc[0] + f["beta_s_per_byte"].iloc[0] * xs
                ax_t.plot(xs, np.clip(pred, 1e-9, None) * 1e3, ls, color=color, lw=1.2,
                          label=f"{label} alpha-beta fit")
        ax_b.plot(g["size_bytes"], g["busbw_GBps"], ls, marker="o", ms=3, color=color, label=label)
    if ceiling_GBps is not None:
        ax_b.axhline(ceiling_GBps, color="black", ls="--", lw=1,
                     label=f"single-thread memcpy {ceiling_GBps:.1f} GB/s")
    ax_t.set_yscale("log")
    ax_t.set_ylabel("time per call (ms, median)")
    ax_t.set_title("time: measured vs alpha + beta S")
    ax_b.set_yscale("log")
    ax_b.set_ylabel("bus bandwidth (GB/s)")
    ax_b.set_title("busbw (nccl-tests convention)")
    for ax in (ax_t, ax_b):
        _size_axis(ax, df["size_bytes"])
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    backend = ", ".join(sorted(df["backend"].unique())) if "backend" in df else ""
    fig.suptitle(title or f"collective sweep ({backend})" if backend else "collective sweep")
    fig.tight_layout()
    return fig


def plot_link_times(table: pd.DataFrame, *, title: str | None = None):
    """Predicted ring all-reduce time of one step's gradients per link and model (log scale),
    from experiments.unit13_interconnects.gradient_allreduce_table."""
    require_columns(table, ["n_params", "link", "time_s"], "table", nonempty=True)
    models = sorted(table["n_params"].unique())
    links = list(dict.fromkeys(table["link"]))
    y = np.arange(len(links))
    height = 0.8 / len(models)
    fig, ax = plt.subplots(figsize=(8, 0.5 * len(links) + 1.5))
    for i, n in enumerate(models):
        g = table[table["n_params"] == n].set_index("link").loc[links]
        bars = ax.barh(y + i * height, g["time_s"] * 1e3, height=height,
                       label=f"{n / 1e9:g}B params ({fmt_bytes(int(g['grad_bytes'].iloc[0]), 'GB', digits=0)} of gradients)"
                       if "grad_bytes" in g else f"{n / 1e9:g}B params")
        for bar, t in zip(bars, g["time_s"]):
            ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {t * 1e3:.3g} ms",
                    va="center", fontsize=7)
    ax.set_yticks(y + height * (len(models) - 1) / 2)
    ax.set_yticklabels(links)
    ax.set_xscale("log")
    ax.set_xlabel("predicted ring all-reduce time (ms), headline GB/s")
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title(title or "gradient all-reduce per step, by link (estimate)")
    fig.tight_layout()
    return fig


def plot_ddp_timeline(events: pd.DataFrame, *, bucket_cap_mb: float | None = None,
                      title: str | None = None):
    """Per-rank Gantt chart of one DDP step: backward of each layer ('compute' lane) and each
    bucket's all-reduce ('comm' lane), on the shared host clock (seconds; 0 = the step's first
    event on any rank), as ``ddp_bucket_sweep(...).events`` returns it."""
    require_columns(events, ["rank", "lane", "name", "start", "end"], "events", nonempty=True)
    if bucket_cap_mb is not None:
        if "bucket_cap_mb" not in events:
            raise ValueError("events has no bucket_cap_mb column to select from")
        caps = sorted(events["bucket_cap_mb"].unique())
        if bucket_cap_mb not in caps:
            raise ValueError(f"bucket_cap_mb={bucket_cap_mb!r} is not in events; valid choices: {caps}")
        events = events[events["bucket_cap_mb"] == bucket_cap_mb]
    ranks = sorted(events["rank"].unique())
    fig, ax = plt.subplots(figsize=(10, 0.9 * 2 * len(ranks) + 1.2))
    labels, colors = [], {"compute": "tab:blue", "comm": "tab:red"}
    for r_i, rank in enumerate(ranks):
        for l_i, lane in enumerate(("compute", "comm")):
            row = 2 * r_i + l_i
            labels.append(f"rank {rank} {lane}")
            ev = events[(events["rank"] == rank) & (events["lane"] == lane)]
            spans = [(s * 1e3, max(e - s, 1e-6) * 1e3) for s, e in zip(ev["start"], ev["end"])]
            ax.broken_barh(spans, (row - 0.35, 0.7), facecolors=colors[lane], edgecolors="white",
                           alpha=0.8)
            if lane == "comm":
                for (x, w), name in zip(spans, ev["name"]):
                    ax.text(x + w / 2, row, name.replace("bucket ", "b"), ha="center",
                            va="center", fontsize=7, color="white")
    ax.set_yticks(range(len(labels)))
    ax.set_yticklabels(labels)
    ax.invert_yaxis()
    ax.set_xlabel("time since the first backward event on any rank (ms, shared host clock)")
    cap = f", bucket_cap_mb={bucket_cap_mb:g}" if bucket_cap_mb is not None else ""
    ax.set_title(title or f"DDP backward: layer gradients (blue) and bucket all-reduces (red){cap}")
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    return fig


def plot_bucket_sweep(summary: pd.DataFrame, *, model: pd.DataFrame | None = None,
                      title: str | None = None):
    """Left: buckets per step (measured by the comm hook) against bucket_cap_mb. Right: what DDP
    adds to a step (step_time_s - local_step_time_s; the step time alone if there is no
    local_step_time_s), and where given the alpha-beta model's total and exposed communication
    time (``model`` with columns bucket_cap_mb, total_comm_s, tail_s)."""
    require_columns(summary, ["bucket_cap_mb", "n_buckets", "step_time_s"], "summary", nonempty=True)
    fig, (ax_n, ax_t) = plt.subplots(1, 2, figsize=(10, 3.8))
    s = summary.sort_values("bucket_cap_mb")
    ax_n.plot(s["bucket_cap_mb"], s["n_buckets"], "o-", color="tab:purple")
    for x, n in zip(s["bucket_cap_mb"], s["n_buckets"]):
        ax_n.annotate(str(int(n)), (x, n), textcoords="offset points", xytext=(0, 6),
                      ha="center", fontsize=8)
    ax_n.set_ylabel("all-reduce calls (buckets) per step")
    if "local_step_time_s" in s:
        ax_t.plot(s["bucket_cap_mb"], (s["step_time_s"] - s["local_step_time_s"]) * 1e3, "o-",
                  color="black", label="measured: DDP step - step without DDP")
    else:
        ax_t.plot(s["bucket_cap_mb"], s["step_time_s"] * 1e3, "o-", color="black",
                  label="measured step (fwd + bwd + comm)")
    if model is not None:
        require_columns(model, ["bucket_cap_mb", "total_comm_s", "tail_s"], "model", nonempty=True)
        m = model.sort_values("bucket_cap_mb")
        ax_t.plot(m["bucket_cap_mb"], m["total_comm_s"] * 1e3, "s--", color="tab:red",
                  label="model: all calls, k alpha + G beta")
        ax_t.plot(m["bucket_cap_mb"], m["tail_s"] * 1e3, "^:", color="tab:orange",
                  label="model: last bucket, alpha + B beta")
    ax_t.set_ylabel("time (ms)")
    ax_t.legend(fontsize=8)
    for ax in (ax_n, ax_t):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("bucket_cap_mb (MiB)")
        ax.grid(True, which="both", alpha=0.3)
    fig.suptitle(title or "DDP bucket size: fewer calls vs a longer last all-reduce")
    fig.tight_layout()
    return fig
