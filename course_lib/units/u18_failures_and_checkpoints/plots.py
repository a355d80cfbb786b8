"""Figures of unit 18 (notebooks/18_failures_and_checkpoints.ipynb): results of ``run.py`` ->
matplotlib Figure. Pure: nothing is measured here.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd

from course_lib.units.u18_failures_and_checkpoints.run_scale import GoodputRow
from course_lib.viz.plots import require_columns, style

READS = {GoodputRow: ("interval_s", "goodput")}

__all__ = ["plot_forget", "plot_timeline", "plot_losses", "plot_cost", "plot_goodput"]

#: one colour per event of the timeline
EVENT_COLORS = {
    "start": "tab:blue",
    "loaded": "tab:green",
    "saved": "tab:orange",
    "killed": "tab:red",
    "peer lost": "tab:purple",
    "done": "black",
}


def plot_forget(df: pd.DataFrame):
    """Loss after the resume, one line per forgotten part, the uninterrupted run dashed.
    ``df``: ``run.forget_table()``."""
    require_columns(df, ["forgot", "step", "loss", "uninterrupted"], "df", nonempty=True)
    with style():
        fig, ax = plt.subplots(figsize=(10, 4.5))
        ref = df[df.forgot == df.forgot.iloc[0]]
        ax.plot(ref["step"], ref["uninterrupted"], "k--", lw=3, label="uninterrupted", zorder=3)
        for part, sub in df.groupby("forgot", sort=False):
            ax.plot(
                sub["step"],
                sub["loss"],
                marker="o",
                lw=1.6,
                label="nothing forgotten" if part == "nothing" else f"forgot {part}",
            )
        ax.set_xlabel("step (the run resumed from its checkpoint)")
        ax.set_ylabel("training loss (measured)")
        ax.set_title("A resume that forgets one part of the state leaves the uninterrupted run")
        ax.legend(fontsize=9, ncol=2)
        fig.tight_layout()
    return fig


def plot_timeline(tl: pd.DataFrame):
    """Every rank's steps and events against wall-clock time, one row per rank and attempt.
    ``tl``: ``run.read_timeline()``."""
    require_columns(tl, ["t", "rank", "attempt", "event"], "tl", nonempty=True)
    with style():
        fig, ax = plt.subplots(figsize=(11, 3.8))
        rows = sorted({(a, r) for a, r in zip(tl.attempt, tl["rank"])})
        ys = {key: i for i, key in enumerate(rows)}
        for (a, r), sub in tl.groupby(["attempt", "rank"]):
            y = ys[(a, r)]
            steps = sub[sub.event == "step"]
            ax.scatter(steps["t"], [y] * len(steps), marker="|", s=300, color="tab:gray")
            for _, e in sub[sub.event != "step"].iterrows():
                ax.scatter(e["t"], y, s=90, color=EVENT_COLORS.get(e["event"], "k"), zorder=3)
        for ev, color in EVENT_COLORS.items():
            if (tl.event == ev).any():
                ax.scatter([], [], color=color, label=ev)
        ax.scatter([], [], marker="|", color="tab:gray", label="step")
        ax.set_yticks(range(len(rows)), [f"attempt {a}, rank {r}" for a, r in rows])
        ax.set_xlabel("seconds since the first rank started (measured)")
        ax.set_title(
            "A rank killed under torchrun --max-restarts 1: every rank restarts from the checkpoint"
        )
        ax.legend(fontsize=9, ncol=4, loc="upper left", bbox_to_anchor=(0, -0.25))
        fig.tight_layout()
    return fig


def plot_losses(df: pd.DataFrame, reference: pd.DataFrame | None = None):
    """Loss per step of a run (and of a reference run, dashed). ``df``: ``run.elastic_run()``."""
    require_columns(df, ["step", "loss"], "df", nonempty=True)
    with style():
        fig, ax = plt.subplots(figsize=(9, 4))
        if reference is not None:
            ax.plot(reference["step"], reference["loss"], "k--", lw=3, label="uninterrupted")
        ax.plot(df["step"], df["loss"], marker="o", label="after the restart")
        ax.set_xlabel("step")
        ax.set_ylabel("training loss (measured)")
        ax.legend()
        fig.tight_layout()
    return fig


def plot_cost(df: pd.DataFrame):
    """Bytes on disk and seconds against parameters; blocking save against async_save.
    ``df``: ``run.save_cost()``."""
    require_columns(
        df,
        ["params", "bytes on disk", "predicted bytes", "blocking s", "async: loop blocked s"],
        "df",
        nonempty=True,
    )
    with style():
        fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
        a.loglog(df["params"], df["bytes on disk"] / 2**20, "o-", label="measured (on disk)")
        a.loglog(df["params"], df["predicted bytes"] / 2**20, "k--", label="12 B/param (estimate)")
        a.set_xlabel("parameters")
        a.set_ylabel("MiB")
        a.legend()
        b.loglog(df["params"], df["blocking s"], "o-", label="blocking save")
        b.loglog(df["params"], df["async: loop blocked s"], "s-", label="async_save: loop blocked")
        b.set_xlabel("parameters")
        b.set_ylabel("seconds (measured, 2 ranks)")
        b.legend()
        fig.suptitle("Checkpoint size and time on this machine")
        fig.tight_layout()
    return fig


def plot_goodput(curves: dict[str, pd.DataFrame], marks: dict[str, float] | None = None):
    """Goodput against the checkpoint interval, one line per setting; vertical marks at the
    optimal intervals. ``curves``: label -> ``run.goodput_curve()``."""
    with style():
        fig, ax = plt.subplots(figsize=(10, 4.5))
        for label, df in curves.items():
            require_columns(df, ["interval_s", "goodput"], label, nonempty=True)
            ax.plot(df["interval_s"] / 60, df["goodput"], lw=2, label=label)
        for label, x in (marks or {}).items():
            ax.axvline(x / 60, ls=":", color="gray")
            ax.text(x / 60, 0.02, label, rotation=90, va="bottom", fontsize=10)
        ax.set_xscale("log")
        ax.set_ylim(0, 1)
        ax.set_xlabel("minutes of training between checkpoints")
        ax.set_ylabel("goodput (Daly 2006)")
        ax.set_title("Too often: time spent saving; too rarely: work lost at each failure")
        ax.legend(fontsize=9)
        fig.tight_layout()
    return fig
