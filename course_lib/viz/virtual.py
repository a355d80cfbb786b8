"""Plots of virtual-cluster results (``course_lib.virtual.simulate_step``).

Every title says "virtual cluster (simulated)": these bytes come from PyTorch's sharding code
traced under FakeTensorMode, not from a GPU. Introduced in notebooks/10_zero_fsdp.ipynb.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from course_lib.virtual.result import SimulatedStep
from course_lib.viz.plots import CATEGORY_COLORS, UNITS, style

__all__ = ["plot_virtual_breakdown", "VIRTUAL_COLORS"]

#: colours of the virtual rows: MemoryMeter's where the category is the same
VIRTUAL_COLORS = {
    **CATEGORY_COLORS,
    "unsharded_params": "tab:cyan",
    "unsharded_grads": "gold",
    "all_gather": "tab:brown",
    "reduce_scatter": "tab:pink",
    "buffers": "black",
    "inputs": "tab:gray",
}


def _bar_label(step: object) -> str:
    return f"{step.strategy}, N={step.world_size}" if isinstance(step, SimulatedStep) else "?"


def plot_virtual_breakdown(
    frames: Any, *, column: str = "at_peak", unit: str = "GiB", title: str | None = None
) -> Figure:
    """One stacked horizontal bar per result: the rank's bytes by category.

    ``frames``: a :class:`~course_lib.virtual.SimulatedStep`, a list of them, or a mapping
    ``{bar label: step}`` (default labels: strategy and world size). ``column``: "at_peak" (the breakdown at the peak; the bar
    is the peak), "after_backward" or "after_step". The title always starts with
    "virtual cluster (simulated)".
    """
    if isinstance(frames, Mapping):
        items = list(frames.items())
    else:
        frames = [frames] if not isinstance(frames, Sequence) else list(frames)
        items = [(_bar_label(f), f) for f in frames]
    if not items:
        raise ValueError("frames = []: expected at least one simulate_step result")
    if unit not in UNITS:
        raise ValueError(f"unit = {unit!r}: expected one of {', '.join(UNITS)}")
    for label, f in items:
        if not isinstance(f, SimulatedStep):
            raise TypeError(
                f"frames[{label!r}] = {type(f).__name__}: expected a virtual-cluster result "
                "(the SimulatedStep that virtual.simulate_step returned)"
            )
        f.at("total", column)  # a column it does not have is refused, naming the valid ones
    scale = UNITS[unit]
    with style():
        fig, ax = plt.subplots(figsize=(10, 1.2 + 0.7 * len(items)))
        seen = set()
        for y, (_label, f) in enumerate(items):
            left = 0.0
            for cat, value in f.breakdown[column].items():
                if cat == "total" or value <= 0:
                    continue
                ax.barh(
                    y,
                    value / scale,
                    left=left,
                    color=VIRTUAL_COLORS.get(cat, "lightgray"),
                    label=None if cat in seen else cat,
                )
                seen.add(cat)
                left += value / scale
        ax.set_yticks(range(len(items)), [label for label, _ in items])
        ax.set_xlabel(f"{unit} on one rank ({column.replace('_', ' ')})")
        head = "virtual cluster (simulated)"
        ax.set_title(
            f"{head}: {title}" if title else f"{head}: per-rank memory, {items[0][1].model}"
        )
        ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    return fig
