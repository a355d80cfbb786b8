"""Plots of unit 13 (notebooks/13_interconnects_and_backends.ipynb): results -> matplotlib Figure.

Pure functions over the DataFrames of course_lib.units.u13_interconnects_and_backends.run; nothing is
measured here. Bandwidths in GB/s (1e9 bytes/s), sizes labelled in KiB/MiB (1024-based).
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.collections import PatchCollection
from matplotlib.patches import Rectangle

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
    fig, (ax_t, ax_b) = plt.subplots(1, 2, figsize=(12, 6))
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
    ax_t.set_title("time per call: measured (points), fitted alpha + beta S (lines)")
    ax_b.set_yscale("log")
    ax_b.set_ylabel("bus bandwidth (GB/s)")
    ax_b.set_title("busbw (nccl-tests convention)")
    for ax in (ax_t, ax_b):
        _size_axis(ax, df["size_bytes"])
        ax.grid(True, which="both", alpha=0.3)
        # below the axes, so that no entry hides a measured point
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2)
    backend = ", ".join(sorted(df["backend"].unique())) if "backend" in df else ""
    fig.suptitle(title or f"collective sweep ({backend})" if backend else "collective sweep")
    fig.tight_layout()
    return fig


def plot_link_times(table: pd.DataFrame, *, title: str | None = None):
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
        bars = ax.barh(y + i * height, g["time_s"] * 1e3, height=height,
                       label=f"{n / 1e9:g}B params ({fmt_bytes(int(g['grad_bytes'].iloc[0]), 'GB', digits=0)} of gradients)"
                       if "grad_bytes" in g else f"{n / 1e9:g}B params")
        for bar, t in zip(bars, g["time_s"]):
            ms = t * 1e3
            ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2,
                    f" {ms:,.0f} ms" if ms >= 100 else f" {ms:.3g} ms", va="center", fontsize=9)
    ax.set_yticks(y + height * (len(models) - 1) / 2)
    ax.set_yticklabels(links)
    ax.set_xscale("log")
    ax.set_xlim(right=float(table["time_s"].max()) * 1e3 * 4)  # room for the labels
    ax.set_xlabel("predicted ring all-reduce time (ms, log scale), at the headline GB/s")
    ax.legend(fontsize=9, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2)
    ax.set_title(title or "gradient all-reduce per step, by link (estimate)")
    fig.tight_layout()
    return fig


def _sub_lanes(spans) -> list[int]:
    """Greedy interval partitioning: the sub-lane of each (start, width) span, so that spans on the
    same sub-lane never overlap in time (the fewest sub-lanes that achieves it)."""
    ends: list[float] = []  # end time of the last span placed on each sub-lane
    lane_of = [0] * len(spans)
    for i in sorted(range(len(spans)), key=lambda k: spans[k][0]):
        x, w = spans[i]
        free = [j for j, e in enumerate(ends) if e <= x]
        if free:
            lane_of[i] = free[0]
            ends[free[0]] = x + w
        else:
            lane_of[i] = len(ends)
            ends.append(x + w)
    return lane_of


def plot_ddp_timeline(events: pd.DataFrame, *, bucket_cap_mb: float | None = None,
                      title: str | None = None):
    """Per-rank Gantt chart of one DDP step: backward of each layer ('compute' lane) and each
    bucket's all-reduce ('comm' lane), on the shared host clock (seconds; 0 = the step's first
    event on any rank), as ``ddp_bucket_sweep(...).events`` returns it. All-reduces in flight at
    the same time are drawn on separate sub-lanes of their rank's comm lane, each labelled with its
    bucket, so none hides another."""
    require_columns(events, ["rank", "lane", "name", "start", "end"], "events", nonempty=True)
    if bucket_cap_mb is not None:
        if "bucket_cap_mb" not in events:
            raise ValueError("events has no bucket_cap_mb column to select from")
        caps = sorted(events["bucket_cap_mb"].unique())
        if bucket_cap_mb not in caps:
            raise ValueError(f"bucket_cap_mb={bucket_cap_mb!r} is not in events; valid choices: {caps}")
        events = events[events["bucket_cap_mb"] == bucket_cap_mb]
    ranks = sorted(events["rank"].unique())
    colors = {"compute": "tab:blue", "comm": "tab:red"}
    lanes = []  # (label, lane kind, spans in ms, names, sub-lane of each span, number of sub-lanes)
    for rank in ranks:
        for lane in ("compute", "comm"):
            ev = events[(events["rank"] == rank) & (events["lane"] == lane)].sort_values("start")
            spans = [(s * 1e3, max(e - s, 1e-6) * 1e3) for s, e in zip(ev["start"], ev["end"])]
            sub = _sub_lanes(spans) if lane == "comm" else [0] * len(spans)
            lanes.append((f"rank {rank} {lane}", lane, spans, list(ev["name"]), sub, max(sub, default=0) + 1))
    n_rows = sum(k for *_, k in lanes)
    fig, ax = plt.subplots(figsize=(10, 0.55 * n_rows + 0.6 * len(lanes) + 1.2))
    top, ticks = 0.0, []
    for _label, lane, spans, names, sub, k in lanes:
        # sub-lane j of this lane is centred at top + j; bars are 0.8 high, lanes 0.5 apart
        rects = [Rectangle((x, top + j - 0.4), w, 0.8) for (x, w), j in zip(spans, sub)]
        ax.add_collection(PatchCollection(rects, facecolors=colors[lane], edgecolors="white", alpha=0.85))
        if lane == "comm":
            for (x, w), j, name in zip(spans, sub, names):
                ax.text(x + w / 2, top + j, name.replace("bucket ", "b"), ha="center", va="center",
                        fontsize=9, color="white", fontweight="bold", clip_on=True)
        ticks.append(top + (k - 1) / 2)
        top += k + 0.5
    ax.set_yticks(ticks)
    ax.set_yticklabels([lane[0] for lane in lanes])
    all_x = [x for lane in lanes for x, _ in lane[2]] + [x + w for lane in lanes for x, w in lane[2]]
    pad = 0.02 * (max(all_x) - min(all_x) or 1.0)
    ax.set_xlim(min(all_x) - pad, max(all_x) + pad)
    ax.set_ylim(top - 0.9, -0.6)  # inverted: rank 0 on top
    ax.set_xlabel("time since the first backward event on any rank (ms, shared host clock)")
    cap = f", bucket_cap_mb={bucket_cap_mb:g}" if bucket_cap_mb is not None else ""
    ax.set_title(title or f"DDP backward: layer gradients (blue) and bucket all-reduces (red){cap}\n"
                          "all-reduces in flight at the same time get their own sub-lane")
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
