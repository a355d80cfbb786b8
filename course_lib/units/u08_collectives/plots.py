"""Plots of unit 08 (collectives). Pure: data in, matplotlib Figure out; nothing is run here.

Used by notebooks/08_collectives.ipynb and course_lib/units/u08_collectives/widgets.py. Every picture is drawn
from tensors the ranks returned (see course_lib/units/u08_collectives/run.py).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes
from matplotlib.colors import TABLEAU_COLORS, to_rgba
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from course_lib.units.u08_collectives.run import AlgorithmBytesRow
from course_lib.units.u08_collectives.run_timing import CurveRow, TimingRow
from course_lib.units.u08_collectives.run_wire import WireRow
from course_lib.viz.plots import styled

__all__ = ["plot_before_after", "plot_bytes", "plot_primitives", "plot_ring_steps", "plot_times"]

READS = {
    AlgorithmBytesRow: (
        "algorithm",
        "rank",
        "wire_bytes_sent",
        "predicted_bytes_sent",
        "size_bytes",
    ),
    WireRow: ("collective", "rank", "wire_bytes_sent", "predicted_bytes_sent", "size_bytes"),
    TimingRow: ("algorithm", "size_bytes", "median_s", "p25_s", "p75_s"),
    CurveRow: ("algorithm", "size_bytes", "predicted_s"),
}

_RANK_COLOURS = list(TABLEAU_COLORS.values())  # tab10
_SUM_COLOUR = "#4d4d4d"  # a value that mixes several ranks' data
_EMPTY_COLOUR = "#f2f2f2"


def _as_array(row) -> np.ndarray:
    return np.asarray(row.detach().cpu().double() if hasattr(row, "detach") else row, dtype=float)


def _reduces(name: str) -> bool:
    """Whether the output of collective ``name`` holds sums (rather than moved values)."""
    return name in ("reduce", "all_reduce", "reduce_scatter") or name.endswith("(from scratch)")


def _cell_colour(value: float, summed: bool):
    """Colour of one cell: the rank whose value it is, grey for a sum, pale for empty.

    Values follow run.piece_value: rank r starts with 10 r + slot, so
    an unreduced value names its rank in its tens digit.
    """
    if math.isnan(value):
        return _EMPTY_COLOUR
    if summed:
        return _SUM_COLOUR
    return _RANK_COLOURS[int(value // 10) % len(_RANK_COLOURS)]


def _draw_grid(ax, rows: Sequence, title: str, *, summed: bool = False) -> None:
    """One panel: ranks as rows, slots as columns, each cell annotated with its value."""
    data = np.stack([_as_array(r) for r in rows])  # (ranks, slots)
    n_ranks, n_slots = data.shape
    for r in range(n_ranks):
        for c in range(n_slots):
            v = data[r, c]
            colour = _cell_colour(v, summed)
            ax.add_patch(Rectangle((c, r), 1, 1, facecolor=colour, edgecolor="white", linewidth=2))
            if not math.isnan(v):
                dark = colour == _SUM_COLOUR or sum(to_rgba(colour)[:3]) < 1.5
                ax.text(
                    c + 0.5,
                    r + 0.5,
                    f"{v:g}",
                    ha="center",
                    va="center",
                    fontsize=11,
                    color="white" if dark else "black",
                )
    ax.set_xlim(0, n_slots)
    ax.set_ylim(n_ranks, 0)
    ax.set_xticks(np.arange(n_slots) + 0.5, [str(c) for c in range(n_slots)])
    ax.set_yticks(np.arange(n_ranks) + 0.5, [f"rank {r}" for r in range(n_ranks)])
    ax.set_xlabel("slot")
    ax.set_title(title, fontsize=12)
    ax.tick_params(length=0)
    ax.grid(False)  # the cells are the grid
    for side in ax.spines.values():
        side.set_visible(False)


@styled
def plot_before_after(
    before: Sequence, after: Sequence, name: str, *, bytes_sent: Sequence[int | None] | None = None
) -> Figure:
    """Two panels, what every rank holds before and after one collective.

    ``before``/``after``: one N-slot row per rank (NaN = nothing there), as returned by
    ``run.run_primitives``. Colours: the rank a value came from;
    dark grey: a sum of several ranks' values; pale: the rank holds nothing there.
    ``bytes_sent``: bytes each rank wrote on the wire, shown beside its name (None: unmeasured).
    """
    n = len(before)
    slots = len(_as_array(before[0]))
    fig, axes = plt.subplots(
        1,
        2,
        figsize=(min(16.0, 3.0 + 2.6 * slots), min(9.0, 0.7 * n + 1.6)),
        constrained_layout=True,
    )
    _draw_grid(axes[0], before, f"{name}: before")
    _draw_grid(axes[1], after, f"{name}: after", summed=_reduces(name))
    if bytes_sent is not None:
        axes[1].set_yticks(
            np.arange(n) + 0.5,
            [
                f"rank {r}  ({'?' if b is None else f'{b:,}'} B on the wire)"
                for r, b in enumerate(bytes_sent)
            ],
        )
    return fig


@styled
def plot_primitives(results: Mapping[str, Mapping[str, Sequence]]) -> Figure:
    """All collectives of ``results`` (name -> {"before", "after", ...}), one row of
    before -> after panels per collective, two collectives per row of the figure."""
    names = list(results)
    n_rows = math.ceil(len(names) / 2)
    n = len(results[names[0]]["before"])
    fig, axes = plt.subplots(
        n_rows, 4, figsize=(16, n_rows * (0.55 * n + 1.3)), constrained_layout=True, squeeze=False
    )
    for i, name in enumerate(names):
        ax_before, ax_after = axes[i // 2, 2 * (i % 2)], axes[i // 2, 2 * (i % 2) + 1]
        _draw_grid(ax_before, results[name]["before"], f"{name}: before")
        _draw_grid(ax_after, results[name]["after"], f"{name}: after", summed=_reduces(name))
        ax_after.set_yticks([])
    for j in range(len(names), 2 * n_rows):
        axes[j // 2, 2 * (j % 2)].set_visible(False)
        axes[j // 2, 2 * (j % 2) + 1].set_visible(False)
    return fig


def _ring_cell(ax: Axes, c: int, r: int, mask: int, n: int, cmap: Any) -> None:
    """Chunk ``c`` of rank ``r``: the set of ranks in ``mask``, shaded by how many."""
    members = [k for k in range(n) if mask >> k & 1]
    shade = cmap(0.15 + 0.8 * len(members) / n)
    ax.add_patch(Rectangle((c, r), 1, 1, facecolor=shade, edgecolor="white", linewidth=2))
    label = "all" if len(members) == n else "+".join(str(k) for k in members)
    if len(label) > 3:  # "0+2+3" is wider than its cell at the figures' smallest text: two lines
        label = label[:3] + "\n" + label[3:]
    ax.text(
        c + 0.5,
        r + 0.5,
        label,
        ha="center",
        va="center",
        fontsize=9,
        linespacing=1.0,
        color="white" if len(members) > n / 2 else "black",
    )


@styled
def plot_ring_steps(records: Sequence[Sequence[Mapping]]) -> Figure:
    """The ring all-reduce step by step, from the ``record=`` lists of every rank.

    ``records[r]`` is rank r's list of step dicts (``collectives.ring_all_reduce(..., record=)``)
    for an input where rank r holds 2**r everywhere, so every value is a bitmask of the ranks
    whose data it already contains. A cell shows that set; its shade is how many ranks it has;
    a black frame marks the chunk the rank sends at the next step.
    """
    n = len(records)
    steps = len(records[0])
    cmap = plt.get_cmap("Blues")
    fig, axes = plt.subplots(
        1, steps, figsize=(2.25 * steps, 0.55 * n + 1.7), constrained_layout=True, squeeze=False
    )
    for s in range(steps):
        ax = axes[0, s]
        for r in range(n):
            state = records[r][s]["state"]
            chunks = [c for c in _chunk_first_values(state, n)]
            nxt = records[r][s + 1]["sent_chunk"] if s + 1 < steps else None
            for c, v in enumerate(chunks):
                if v is None:
                    continue
                _ring_cell(ax, c, r, int(round(v)), n, cmap)
                if c == nxt:
                    ax.add_patch(
                        Rectangle(
                            (c + 0.06, r + 0.06),
                            0.88,
                            0.88,
                            fill=False,
                            edgecolor="black",
                            linewidth=2,
                        )
                    )
        phase = records[0][s]["phase"]
        ax.set_title("input" if s == 0 else f"step {s}\n{phase}", fontsize=10)
        ax.set_xlim(0, n)
        ax.set_ylim(n, 0)
        ax.set_xticks(np.arange(n) + 0.5, [f"c{c}" for c in range(n)])
        ax.set_yticks(np.arange(n) + 0.5, [f"rank {r}" for r in range(n)] if s == 0 else [])
        ax.tick_params(length=0)
        ax.grid(False)
        for side in ax.spines.values():
            side.set_visible(False)
    fig.suptitle(
        "ring all-reduce: which ranks' data each chunk holds (framed: sent next)", fontsize=12
    )
    return fig


def _chunk_first_values(state, n: int) -> list[float | None]:
    """First value of each of the n tensor_split chunks of a flat state (None if empty)."""
    flat = _as_array(state).reshape(-1)
    base, extra = divmod(flat.size, n)
    out, start = [], 0
    for c in range(n):
        size = base + (1 if c < extra else 0)
        out.append(float(flat[start]) if size else None)
        start += size
    return out


@styled
def plot_bytes(
    df,
    *,
    group: str = "algorithm",
    per_size: bool = False,
    title: str = "bytes sent per rank: measured on the wire (bars) vs estimate (black ticks)",
) -> Figure:
    """Grouped bars of the bytes each rank sent on the wire, with estimate's prediction marked.

    ``df``: rows with ``group`` (e.g. algorithm or collective), rank, wire_bytes_sent,
    predicted_bytes_sent and size_bytes (``run.measure_bytes``,
    ``wire_bytes.measure_wire_bytes``). ``per_size``: plot multiples of S instead of KiB. A rank
    whose wire bytes were not measured (None) gets no bar, only its tick.
    """
    groups = list(dict.fromkeys(df[group]))
    ranks = sorted(set(df["rank"]))
    width = 0.8 / len(ranks)
    scale = df["size_bytes"].astype(float) if per_size else 1024.0
    values = df.assign(
        _wire=df["wire_bytes_sent"].astype(float) / scale,
        _predicted=df["predicted_bytes_sent"].astype(float) / scale,
    )
    fig, ax = plt.subplots(
        figsize=(2.0 + (1.3 if per_size else 2.2) * len(groups), 4.2), constrained_layout=True
    )
    for j, r in enumerate(ranks):
        sub = values[values["rank"] == r].set_index(group).loc[groups]
        x = np.arange(len(groups)) - 0.4 + width * (j + 0.5)
        ax.bar(x, sub["_wire"].fillna(0.0), width, color=_RANK_COLOURS[j % 10], label=f"rank {r}")
        ax.scatter(
            x,
            sub["_predicted"],
            marker="_",
            s=400 * width / 0.2,
            color="black",
            zorder=3,
            label="estimate" if j == 0 else None,
        )
    labels = [g.replace("+", "+\n").replace(" (from scratch)", "\n(from scratch)") for g in groups]
    ax.set_xticks(
        np.arange(len(groups)),
        labels,
        rotation=30 if per_size else 0,
        ha="right" if per_size else "center",
        fontsize=9,
    )
    ax.set_ylabel("bytes sent / S" if per_size else "KiB sent (1 KiB = 1024 B)")
    ax.set_title(title, fontsize=11)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(ncol=min(len(ranks) + 1, 5), fontsize=9)
    return fig


def _size_markers(ax: Axes, markers: Mapping[str, float | None]) -> None:
    """Dotted or dashed vertical lines at the given sizes (a None size is skipped)."""
    for j, (label, size) in enumerate(markers.items()):
        if size is not None:
            ax.axvline(
                size,
                color=("tab:purple", "black")[j % 2],
                ls=("--", ":")[j % 2],
                lw=1.5,
                label=label,
            )


@styled
def plot_times(
    times,
    model=None,
    *,
    title: str = "all-reduce time vs message size",
    markers: Mapping[str, float | None] | None = None,
) -> Figure:
    """Measured medians (points, quartile bars) per algorithm on log-log axes, with the model's
    curves (lines) when ``model`` (algorithm, size_bytes, predicted_s) is given.

    ``times``: rows with algorithm, size_bytes, median_s, p25_s, p75_s
    (``run.time_all_reduce``).
    ``markers``: label -> size in bytes, drawn as dotted vertical lines (e.g. the model's and the
    measured crossover); a None size is skipped.
    """
    fig, ax = plt.subplots(figsize=(9, 5.2), constrained_layout=True)
    algorithms = list(dict.fromkeys(times["algorithm"]))
    for i, algorithm in enumerate(algorithms):
        sub = times[times["algorithm"] == algorithm].sort_values("size_bytes")
        colour = _RANK_COLOURS[i % 10]
        err = np.vstack([sub["median_s"] - sub["p25_s"], sub["p75_s"] - sub["median_s"]]) * 1e3
        ax.errorbar(
            sub["size_bytes"],
            sub["median_s"] * 1e3,
            yerr=np.clip(err, 0, None),
            fmt="o",
            color=colour,
            capsize=3,
            label=f"{algorithm} (measured)",
        )
        if model is not None and algorithm in set(model["algorithm"]):
            curve = model[model["algorithm"] == algorithm].sort_values("size_bytes")
            ax.plot(
                curve["size_bytes"],
                curve["predicted_s"] * 1e3,
                "-",
                color=colour,
                alpha=0.8,
                label=f"{algorithm} (alpha-beta model)",
            )
    _size_markers(ax, markers or {})
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    sizes = sorted(set(int(v) for v in times["size_bytes"]))
    ax.set_xticks(sizes)
    ax.set_xticklabels([_fmt_size(v) for v in sizes])
    ax.set_xlabel("message size S (log scale; B, KiB, MiB = 1024-based)")
    ax.set_ylabel("time per all-reduce (ms, median; bars: quartiles)")
    ax.set_title(title, fontsize=11)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=9)
    return fig


def _fmt_size(n: int) -> str:
    """256 -> '256 B', 65536 -> '64 KiB', 16777216 -> '16 MiB' (1024-based, no trailing zeros)."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:g} {unit}"
    return f"{n} B"
