"""Shared plots and the course's plot style: results (dicts, DataFrames) -> matplotlib Figure.

Pure functions: nothing is measured here, nothing is shown (a notebook cell ending in
``plot_...(...);`` displays the figure; tests draw on the Agg backend). Figures are made with
``plt.subplots`` so Jupyter's inline backend shows them at the end of the cell.

The course's plot style and readable-text rules live in :mod:`course_lib.viz.style` (re-exported
here, so ``course_lib.viz.plots.style()`` keeps working); this file holds the shared memory plots
``plot_measured_vs_predicted`` and ``plot_memory_timeline``.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from course_lib.measure.estimate import fmt_bytes
from course_lib.viz.style import (
    CATEGORY_COLORS,
    DISPLAY_WIDTH_PX,
    LINE_CHARS,
    MIN_TEXT_PX,
    PHASE_COLORS,
    STYLE,
    UNITS,
    _check_mapping,
    _unit,
    print_wrapped,
    readable,
    require_columns,
    style,
    styled,
    text_px,
    wrap,
)

__all__ = [
    "STYLE",
    "style",
    "styled",
    "CATEGORY_COLORS",
    "PHASE_COLORS",
    "UNITS",
    "MIN_TEXT_PX",
    "DISPLAY_WIDTH_PX",
    "LINE_CHARS",
    "text_px",
    "readable",
    "wrap",
    "print_wrapped",
    "require_columns",
    "plot_measured_vs_predicted",
    "plot_memory_timeline",
]


# ============================================================================================
# memory
# ============================================================================================
def _stacked_bar(
    ax: Axes,
    x: float,
    values: Mapping[str, float],
    cats: list[str],
    div: float,
    *,
    labelled: list[str],
) -> None:
    """One bar of category segments stacked bottom-up, its total written on top."""
    bottom = 0.0
    for cat in cats:
        height = values.get(cat, 0) / div
        if height:
            ax.bar(
                x,
                height,
                bottom=bottom,
                width=0.6,
                color=CATEGORY_COLORS.get(cat, "black"),
                label=cat if cat in labelled else None,
            )
            bottom += height
    ax.text(x, bottom, f"{bottom:,.2f}", ha="center", va="bottom")


def _residual_text(
    measured: Mapping[str, float], predicted: Mapping[str, float], cats: list[str]
) -> str:
    """measured - predicted per category and in total, one line each."""
    lines = ["measured - predicted"]
    for cat in cats:
        diff = measured.get(cat, 0) - predicted.get(cat, 0)
        lines.append(f"{cat}: {'+' if diff >= 0 else '-'}{fmt_bytes(abs(diff))}")
    total = sum(measured.get(c, 0) for c in cats) - sum(predicted.get(c, 0) for c in cats)
    lines.append(f"total: {'+' if total >= 0 else '-'}{fmt_bytes(abs(total))}")
    return "\n".join(lines)


def plot_measured_vs_predicted(
    measured: Mapping[str, float],
    predicted: Mapping[str, float],
    *,
    title: str = "Memory: measured vs predicted",
    unit: str = "MiB",
    skip_total: bool = True,
) -> Figure:
    """Two stacked bars (predicted, measured), one segment per category, and the residual.

    ``measured``/``predicted``: category -> bytes (e.g. ``mem.peak_breakdown`` and
    ``estimate.model_state_bytes(...)`` plus an activation estimate). A "total" key is ignored
    (``skip_total``). Categories missing on one side count as 0. The annotation on the right
    gives measured - predicted per category and in total.
    """
    measured, predicted = (
        _check_mapping("measured", measured),
        _check_mapping("predicted", predicted),
    )
    div = _unit(unit)
    cats = [
        c
        for c in dict.fromkeys([*CATEGORY_COLORS, *predicted, *measured])
        if not (skip_total and c == "total") and (measured.get(c, 0) or predicted.get(c, 0))
    ]
    with style():
        fig, ax = plt.subplots(figsize=(9, 5.5))
        for x, values in ((0, predicted), (1, measured)):
            # the legend names each category once: from the predicted bar, or measured-only ones
            labelled = cats if x == 0 else [c for c in cats if not predicted.get(c, 0)]
            _stacked_bar(ax, x, values, cats, div, labelled=labelled)
        ax.margins(y=0.12)
        ax.set_xticks([0, 1], ["predicted", "measured"])
        ax.set_xlim(-0.6, 2.4)
        ax.set_ylabel(unit)
        ax.set_title(title)
        ax.text(
            1.42,
            0.02,
            _residual_text(measured, predicted, cats),
            transform=ax.get_xaxis_transform(),
            va="bottom",
            fontsize=11,
            family="monospace",
            bbox=dict(boxstyle="round", facecolor="white", alpha=0.8),
        )
        handles, labels = ax.get_legend_handles_labels()
        ax.legend(handles[::-1], labels[::-1], loc="upper right", fontsize=11)
        fig.tight_layout()
    return fig


def _timeline_categories(timeline: Any, categories: Iterable[str] | None) -> list[str]:
    """The categories to stack, once ``timeline`` is checked to be a non-empty MemoryMeter timeline."""
    import pandas as pd

    if not isinstance(timeline, pd.DataFrame):
        raise TypeError(
            f"timeline must be a pandas DataFrame (MemoryMeter.timeline), got "
            f"{type(timeline).__name__}"
        )
    from course_lib.measure.memory import CATEGORIES

    cats = list(categories) if categories is not None else [c for c in CATEGORIES if c in timeline]
    missing = [c for c in ["event", "phase", *cats] if c not in timeline.columns]
    if missing or not cats:
        raise ValueError(
            f"timeline is missing columns {missing or list(CATEGORIES)}; it has "
            f"{list(timeline.columns)}"
        )
    if timeline.empty:
        raise ValueError("timeline is empty: run the block inside MemoryMeter first")
    return cats


def _shade_phases(ax: Axes, phases: list[str]) -> None:
    """Shade contiguous runs of the same phase (forward, backward, step), each labelled once."""
    start = 0
    seen = set()
    for i in range(1, len(phases) + 1):
        if i == len(phases) or phases[i] != phases[start]:
            phase = phases[start]
            if phase in PHASE_COLORS:
                ax.axvspan(
                    start - 0.5,
                    i - 0.5,
                    color=PHASE_COLORS[phase],
                    zorder=0,
                    label=phase if phase not in seen else None,
                )
                seen.add(phase)
            start = i


def _mark_peak(ax: Axes, tl: Any, cats: list[str], div: float) -> None:
    """Annotate the timeline's ``peak`` row with its total."""
    peak = tl.index[tl.event == "peak"]
    if len(peak):
        i = int(peak[0])
        total = sum(tl.loc[i, c] for c in cats)
        ax.annotate(
            f"peak {fmt_bytes(total)}",
            (i, total / div),
            xytext=(0, 12),
            textcoords="offset points",
            ha="center",
            fontsize=12,
            zorder=3,
            arrowprops=dict(arrowstyle="-"),
        )


def plot_memory_timeline(
    timeline: Any,
    *,
    title: str = "Memory during a training step",
    unit: str = "MiB",
    categories: Iterable[str] | None = None,
) -> Figure:
    """Stacked areas of memory by category over the events of ``MemoryMeter.timeline``, with the
    phases shaded (forward accumulates activations; backward frees them and creates gradients;
    the first optimizer step creates the optimizer state) and the peak marked.

    ``timeline``: a DataFrame with columns ``event``, ``phase`` and one per category.
    """
    cats = _timeline_categories(timeline, categories)
    div = _unit(unit)
    tl = timeline.reset_index(drop=True)
    xs = list(range(len(tl)))
    with style():
        fig, ax = plt.subplots(figsize=(11, 5))
        _shade_phases(ax, list(tl.phase))
        ax.stackplot(
            xs,
            *[tl[c] / div for c in cats],
            labels=cats,
            zorder=2,
            alpha=0.9,
            colors=[CATEGORY_COLORS.get(c, "black") for c in cats],
        )
        _mark_peak(ax, tl, cats, div)
        ax.set_xlim(-0.5, len(tl) - 0.5)
        ax.set_ylim(0, max(1e-12, (tl[cats].sum(axis=1).max() / div) * 1.15))
        ax.set_xlabel("event (module hooks, optimizer step)")
        ax.set_ylabel(unit)
        ax.set_title(title)
        handles, labels = ax.get_legend_handles_labels()
        ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=11)
        fig.tight_layout()
    return fig
