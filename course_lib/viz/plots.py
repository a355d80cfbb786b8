"""Shared plots and the course's plot style: results (dicts, DataFrames) -> matplotlib Figure.

Pure functions: nothing is measured here, nothing is shown (a notebook cell ending in
``plot_...(...);`` displays the figure; tests draw on the Agg backend). Figures are made with
``plt.subplots`` so Jupyter's inline backend shows them at the end of the cell.

Style, the same in every unit: one colour per memory category (``CATEGORY_COLORS``), large fonts
(``STYLE``, readable from the back of a lecture room), bytes shown in MiB (2**20) unless a
function says otherwise. Unit-specific plots live in ``course_lib/units/uNN_topic/plots.py`` and
reuse ``CATEGORY_COLORS``, ``PHASE_COLORS`` and ``style()``.

Contents:
  * style: ``STYLE``, ``style()``, ``CATEGORY_COLORS``, ``PHASE_COLORS``
  * memory: ``plot_measured_vs_predicted``, ``plot_memory_timeline``
"""
from __future__ import annotations

import numbers
from contextlib import contextmanager
from typing import Iterator, Mapping

import matplotlib.pyplot as plt

from course_lib.measure.estimate import fmt_bytes

__all__ = ["STYLE", "style", "CATEGORY_COLORS", "PHASE_COLORS", "UNITS",
           "plot_measured_vs_predicted", "plot_memory_timeline"]

# ============================================================================================
# style
# ============================================================================================
#: rcParams applied while a course figure is drawn (big, plain, readable when projected)
STYLE = {
    "font.size": 14, "axes.titlesize": 16, "axes.labelsize": 14, "legend.fontsize": 12,
    "xtick.labelsize": 12, "ytick.labelsize": 12, "figure.titlesize": 17,
    "axes.spines.top": False, "axes.spines.right": False, "axes.grid": True,
    "grid.alpha": 0.3, "figure.dpi": 100, "savefig.bbox": "tight",
}

#: one colour per MemoryMeter category, used by every memory plot of the course
CATEGORY_COLORS = {"params": "tab:blue", "grads": "tab:orange", "optimizer": "tab:green",
                   "activations": "tab:red", "temporaries": "tab:purple", "other": "tab:gray",
                   "master": "tab:olive"}

#: background shading of the phases of a training step
PHASE_COLORS = {"forward": "#dbe9f6", "backward": "#fbe3d6", "step": "#dcefdc"}

#: bytes per display unit
UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "KB": 10**3, "MB": 10**6, "GB": 10**9}


def require_columns(df, columns: list[str], name: str, *, nonempty: bool = False) -> None:
    """Raise TypeError/ValueError unless ``df`` is a DataFrame with ``columns`` (and, with
    ``nonempty``, at least one row): the input check of every plot function."""
    import pandas as pd

    if not isinstance(df, pd.DataFrame):
        raise TypeError(f"{name} must be a pandas DataFrame, got {type(df).__name__}")
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ValueError(f"{name} is missing columns {missing}; it has {list(df.columns)}")
    if nonempty and df.empty:
        raise ValueError(f"{name} is empty: nothing to plot")


_BACKEND_RESOLVED = False


@contextmanager
def style() -> Iterator[None]:
    """Context manager: draw with the course style (``STYLE``) without touching global rcParams."""
    # Resolve the backend *before* entering rc_context. matplotlib picks its backend lazily on
    # first use; if that happens inside rc_context, leaving the context restores the unresolved
    # backend setting and Jupyter's inline backend stops showing every later figure.
    global _BACKEND_RESOLVED
    if not _BACKEND_RESOLVED:
        plt.close(plt.figure())
        _BACKEND_RESOLVED = True
    with plt.rc_context(STYLE):
        yield


def _unit(unit: str) -> float:
    if unit not in UNITS:
        raise ValueError(f"unit={unit!r} is not supported; valid choices: {', '.join(UNITS)}")
    return UNITS[unit]


def _check_mapping(name: str, value) -> dict:
    if not isinstance(value, Mapping):
        raise TypeError(f"{name} must be a dict of category -> bytes, got {type(value).__name__}")
    for k, v in value.items():
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            raise TypeError(f"{name}[{k!r}] must be a number of bytes, got {v!r}")
    return dict(value)


# ============================================================================================
# memory
# ============================================================================================
def plot_measured_vs_predicted(measured: Mapping[str, float], predicted: Mapping[str, float], *,
                               title: str = "Memory: measured vs predicted", unit: str = "MiB",
                               skip_total: bool = True):
    """Two stacked bars (predicted, measured), one segment per category, and the residual.

    ``measured``/``predicted``: category -> bytes (e.g. ``mem.peak_breakdown`` and
    ``estimate.model_state_bytes(...)`` plus an activation estimate). A "total" key is ignored
    (``skip_total``). Categories missing on one side count as 0. The annotation on the right
    gives measured - predicted per category and in total.
    """
    measured, predicted = _check_mapping("measured", measured), _check_mapping("predicted", predicted)
    div = _unit(unit)
    cats = [c for c in dict.fromkeys([*CATEGORY_COLORS, *predicted, *measured])
            if not (skip_total and c == "total") and (measured.get(c, 0) or predicted.get(c, 0))]
    with style():
        fig, ax = plt.subplots(figsize=(9, 5.5))
        for x, values in ((0, predicted), (1, measured)):
            bottom = 0.0
            for cat in cats:
                height = values.get(cat, 0) / div
                if height:
                    ax.bar(x, height, bottom=bottom, width=0.6,
                           color=CATEGORY_COLORS.get(cat, "black"),
                           label=cat if x == 0 or not predicted.get(cat, 0) else None)
                    bottom += height
            ax.text(x, bottom, f"{bottom:,.2f}", ha="center", va="bottom")
        ax.margins(y=0.12)
        ax.set_xticks([0, 1], ["predicted", "measured"])
        ax.set_xlim(-0.6, 2.4)
        ax.set_ylabel(unit)
        ax.set_title(title)
        lines = ["measured - predicted"]
        for cat in cats:
            diff = measured.get(cat, 0) - predicted.get(cat, 0)
            lines.append(f"{cat}: {'+' if diff >= 0 else '-'}{fmt_bytes(abs(diff))}")
        total = sum(measured.get(c, 0) for c in cats) - sum(predicted.get(c, 0) for c in cats)
        lines.append(f"total: {'+' if total >= 0 else '-'}{fmt_bytes(abs(total))}")
        ax.text(1.42, 0.02, "\n".join(lines), transform=ax.get_xaxis_transform(), va="bottom",
                fontsize=11, family="monospace",
                bbox=dict(boxstyle="round", facecolor="white", alpha=0.8))
        handles, labels = ax.get_legend_handles_labels()
        ax.legend(handles[::-1], labels[::-1], loc="upper right", fontsize=11)
        fig.tight_layout()
    return fig


def plot_memory_timeline(timeline, *, title: str = "Memory during a training step",
                         unit: str = "MiB", categories=None):
    """Stacked areas of memory by category over the events of ``MemoryMeter.timeline``, with the
    phases shaded (forward accumulates activations; backward frees them and creates gradients;
    the first optimizer step creates the optimizer state) and the peak marked.

    ``timeline``: a DataFrame with columns ``event``, ``phase`` and one per category.
    """
    import pandas as pd

    if not isinstance(timeline, pd.DataFrame):
        raise TypeError(f"timeline must be a pandas DataFrame (MemoryMeter.timeline), got "
                        f"{type(timeline).__name__}")
    from course_lib.measure.memory import CATEGORIES

    cats = list(categories) if categories is not None else [c for c in CATEGORIES if c in timeline]
    missing = [c for c in ["event", "phase", *cats] if c not in timeline.columns]
    if missing or not cats:
        raise ValueError(f"timeline is missing columns {missing or list(CATEGORIES)}; it has "
                         f"{list(timeline.columns)}")
    if timeline.empty:
        raise ValueError("timeline is empty: run the block inside MemoryMeter first")
    div = _unit(unit)
    tl = timeline.reset_index(drop=True)
    xs = list(range(len(tl)))
    with style():
        fig, ax = plt.subplots(figsize=(11, 5))
        # phase shading: contiguous runs of the same phase
        start = 0
        seen = set()
        for i in range(1, len(tl) + 1):
            if i == len(tl) or tl.phase[i] != tl.phase[start]:
                phase = tl.phase[start]
                if phase in PHASE_COLORS:
                    ax.axvspan(start - 0.5, i - 0.5, color=PHASE_COLORS[phase], zorder=0,
                               label=phase if phase not in seen else None)
                    seen.add(phase)
                start = i
        ax.stackplot(xs, *[tl[c] / div for c in cats], labels=cats, zorder=2, alpha=0.9,
                     colors=[CATEGORY_COLORS.get(c, "black") for c in cats])
        peak = tl.index[tl.event == "peak"]
        if len(peak):
            i = int(peak[0])
            total = sum(tl.loc[i, c] for c in cats)
            ax.annotate(f"peak {fmt_bytes(total)}", (i, total / div), xytext=(0, 12),
                        textcoords="offset points", ha="center", fontsize=12, zorder=3,
                        arrowprops=dict(arrowstyle="-"))
        ax.set_xlim(-0.5, len(tl) - 0.5)
        ax.set_ylim(0, max(1e-12, (tl[cats].sum(axis=1).max() / div) * 1.15))
        ax.set_xlabel("event (module hooks, optimizer step)")
        ax.set_ylabel(unit)
        ax.set_title(title)
        handles, labels = ax.get_legend_handles_labels()
        ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=11)
        fig.tight_layout()
    return fig
