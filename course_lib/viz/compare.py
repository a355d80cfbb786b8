"""The predicted-beside-measured figure, drawn on an Axes (``kit.bars_beside``, ``kit.line_beside``).

Every lecture puts the estimate next to the measurement in one of two ways: side-by-side bars per
case (:func:`bars_beside`: predicted grey and hatched on the left, measured in colour on the right)
or, over a swept quantity, a dashed line for the estimate and markers for the measurement
(:func:`line_beside`). Both draw into an Axes the caller made inside
:func:`course_lib.viz.plots.style`, so titles, scales and legends stay the caller's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from matplotlib.axes import Axes
from matplotlib.container import BarContainer

__all__ = ["PREDICTED_BAR", "bars_beside", "line_beside"]

#: how a predicted bar looks unless the caller says otherwise
PREDICTED_BAR: Mapping[str, Any] = {"color": "lightgray", "edgecolor": "black", "hatch": "//"}


def _floats(name: str, values: Iterable[Any], n: int | None = None) -> list[float]:
    out = [float(v) for v in values]
    if n is not None and len(out) != n:
        raise ValueError(f"{name} = {len(out)} values: expected {n}, one per label")
    return out


def bars_beside(
    ax: Axes,
    labels: Sequence[Any],
    predicted: Iterable[Any],
    measured: Iterable[Any],
    *,
    color: Any = "tab:blue",
    scale: float = 1.0,
    width: float = 0.4,
    names: tuple[str, str] = ("predicted (estimate)", "measured"),
    predicted_style: Mapping[str, Any] = PREDICTED_BAR,
) -> BarContainer:
    """A predicted bar left of a measured bar at each of ``labels`` (values divided by ``scale``).

    ``color``: the measured bars' colour (one, or one per label); ``names``: their legend
    entries. The x ticks are the labels. Returns the measured bars (for ``ax.bar_label``).
    """
    n = len(labels)
    xs = range(n)
    ax.bar(
        [x - width / 2 for x in xs],
        [v / scale for v in _floats("predicted", predicted, n)],
        width,
        label=names[0],
        **predicted_style,
    )
    bars = ax.bar(
        [x + width / 2 for x in xs],
        [v / scale for v in _floats("measured", measured, n)],
        width,
        color=color,
        label=names[1],
    )
    ax.set_xticks(list(xs), [str(label) for label in labels])
    return bars


def line_beside(
    ax: Axes,
    x: Iterable[Any],
    predicted: Iterable[Any],
    measured: Iterable[Any],
    *,
    color: Any,
    marker: str = "o",
    scale: float = 1.0,
    names: tuple[str | None, str | None] = ("predicted", "measured"),
    **marker_style: Any,
) -> None:
    """The estimate as a dashed line and the measurement as markers, over ``x``, in one colour.

    Values are divided by ``scale``; ``names`` are the two legend entries (``None``: none);
    ``marker_style`` goes to the markers (``ms``, ``mfc``, ...).
    """
    xs = _floats("x", x)
    ax.plot(
        xs,
        [v / scale for v in _floats("predicted", predicted, len(xs))],
        "--",
        color=color,
        label=names[0],
    )
    ax.plot(
        xs,
        [v / scale for v in _floats("measured", measured, len(xs))],
        marker,
        color=color,
        label=names[1],
        **marker_style,
    )
