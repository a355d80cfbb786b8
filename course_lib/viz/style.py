"""The course's plot style, re-exported by :mod:`course_lib.viz.plots`.

Style, the same in every unit: one colour per memory category (``CATEGORY_COLORS``), large fonts
(``STYLE``, readable from the back of a lecture room), bytes shown in MiB (2**20) unless a
function says otherwise. Unit-specific plots live in ``course_lib/units/uNN_topic/plots.py`` and
reuse ``CATEGORY_COLORS``, ``PHASE_COLORS`` and ``style()`` (or the ``@styled`` decorator).

Minimum text size: **12 px on screen** (``MIN_TEXT_PX``), for every piece of text of every figure
(ticks, legends, annotations, titles, the values drawn in grid cells), as a learner sees it in
JupyterLab at a 1400 px wide page. 12 px is just under JupyterLab's own 13 px output text (the
smallest size the page already asks a reader to read) and about 9 pt on a 96 dpi screen; smaller
text is what reviewers could not read on a laptop or from the back of a lecture room. What
"on screen" means, measured in JupyterLab 4 with Chromium at 1400 x 1000 px:

* the inline backend stores a PNG of the figure at the figure's own dpi (100 here), cropped to
  its content plus 0.1 in (``bbox_inches="tight"``), so a text of s pt is s * 100 / 72 px there;
* JupyterLab shows a PNG at its own pixel size, shrunk to fit the output area: 968 px wide with
  the default file-browser sidebar open (1220 px with it closed; ``DISPLAY_WIDTH_PX`` takes the
  narrower), so a 1190 px wide PNG is shown at 0.81 of its size.

So on screen a text measures ``s * dpi / 72 * min(1, DISPLAY_WIDTH_PX / png_width)`` px
(``text_px``). ``style()`` enforces the minimum when it closes: any text of a figure made inside
it that would be smaller is enlarged to the minimum (``readable``); tick labels through
``tick_params`` so that redrawn ticks keep the size. Wide figures therefore get larger fonts (a
16 in figure needs 14.3 pt). Printed prose in a notebook goes through ``wrap`` (``print_wrapped``):
at most ``LINE_CHARS`` = 110 characters of monospace, which JupyterLab's output area (7.8 px a
character at 13 px, 968 px wide, so 123 characters) shows without wrapping a line mid-word.
"""

from __future__ import annotations

import functools
import numbers
import textwrap
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, ParamSpec, TypeVar

import matplotlib.pyplot as plt

from course_lib import validate

if TYPE_CHECKING:
    from matplotlib.text import Text
    from matplotlib.typing import RcKeyType

_P = ParamSpec("_P")
_R = TypeVar("_R")

# ============================================================================================
# style
# ============================================================================================
#: rcParams applied while a course figure is drawn (big, plain, readable when projected)
STYLE: dict[RcKeyType, Any] = {
    "font.size": 14,
    "axes.titlesize": 16,
    "axes.labelsize": 14,
    "legend.fontsize": 12,
    "xtick.labelsize": 12,
    "ytick.labelsize": 12,
    "figure.titlesize": 17,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "figure.dpi": 100,
    "savefig.bbox": "tight",
}


#: one colour per MemoryMeter category, used by every memory plot of the course
CATEGORY_COLORS = {
    "params": "tab:blue",
    "grads": "tab:orange",
    "optimizer": "tab:green",
    "activations": "tab:red",
    "temporaries": "tab:purple",
    "other": "tab:gray",
    "master": "tab:olive",
}


#: background shading of the phases of a training step
PHASE_COLORS = {"forward": "#dbe9f6", "backward": "#fbe3d6", "step": "#dcefdc"}


#: bytes per display unit
UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "KB": 10**3, "MB": 10**6, "GB": 10**9}


def require_columns(df: Any, columns: list[str], name: str, *, nonempty: bool = False) -> None:
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


#: the smallest text, in pixels on screen, any course figure may show (see the module docstring)
MIN_TEXT_PX = 12.0


#: width in CSS px of JupyterLab's output area at a 1400 px page with the file browser open
DISPLAY_WIDTH_PX = 968


#: longest printed line (characters) the output area shows unwrapped at that width, with margin
LINE_CHARS = 110


_PAD_INCHES = 0.1  # what the inline backend's bbox_inches="tight" adds around the content


@contextmanager
def style() -> Iterator[None]:
    """Context manager: draw with the course style (``STYLE``) without touching global rcParams.
    Every figure made inside it gets ``readable`` when the context closes."""
    # Resolve the backend *before* entering rc_context. matplotlib picks its backend lazily on
    # first use; if that happens inside rc_context, leaving the context restores the unresolved
    # backend setting and Jupyter's inline backend stops showing every later figure.
    global _BACKEND_RESOLVED
    if not _BACKEND_RESOLVED:
        plt.close(plt.figure())
        _BACKEND_RESOLVED = True
    before = set(plt.get_fignums())
    with plt.rc_context(STYLE):
        yield
        for num in sorted(set(plt.get_fignums()) - before):
            readable(plt.figure(num))


def styled(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """Decorator: run a plot function inside ``style()`` (for functions not written as
    ``with style(): ...``)."""

    @functools.wraps(fn)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        with style():
            return fn(*args, **kwargs)

    return wrapper


def _texts_px(fig: Any, below: float = float("inf")) -> tuple[list[tuple[Text, float]], float]:
    """``(Text, px on screen)`` for every text ``fig`` shows that measures under ``below`` px,
    and the figure's screen scale (screen pixels per PNG pixel: JupyterLab shrinks a PNG wider
    than its output area). One layout pass and one tight bounding box serve both; a text's
    extent (is it inside the drawn area?) is measured only for texts under ``below``."""
    from matplotlib.text import Text

    renderer = fig.canvas.get_renderer()
    fig.draw_without_rendering()  # ticks and layout as they will be drawn
    tight = fig.get_tightbbox(renderer)  # inches
    scale = min(1.0, DISPLAY_WIDTH_PX / ((tight.width + 2 * _PAD_INCHES) * fig.dpi))
    box = tight.transformed(fig.dpi_scale_trans)
    out = []
    for t in fig.findobj(Text):
        px = t.get_fontsize() * fig.dpi / 72 * scale
        if px >= below or not (t.get_visible() and t.get_text().strip()):
            continue
        if t.axes is not None and not t.axes.get_visible():
            continue
        extent = t.get_window_extent(renderer)
        if extent.width and box.overlaps(extent):  # tick labels outside the view are not drawn
            out.append((t, px))
    return out, scale


def text_px(fig: Any) -> list[tuple[Text, float]]:
    """``(Text, size in px on screen)`` for every text ``fig`` shows (module docstring)."""
    return _texts_px(fig)[0]


def readable(fig: Any, *, min_px: float = MIN_TEXT_PX) -> Any:
    """Enlarge every text of ``fig`` smaller than ``min_px`` on screen to ``min_px``; ``fig``.

    Tick labels are enlarged through ``tick_params`` (so ticks matplotlib makes again at the
    next draw keep the size); other texts (titles, labels, legends, annotations, cell values)
    directly. A figure without a layout engine or a figure legend is laid out again
    (``tight_layout``) if anything grew; a plot function that places those itself should choose
    sizes at or above the minimum (``tests/viz/test_readable.py`` measures them). Repeated because larger text can widen the PNG, which JupyterLab then shrinks more.
    """
    changed = False
    for _ in range(4):
        small, scale = _texts_px(fig, below=min_px - 1e-6)
        if not small:
            break
        changed = True
        target = (min_px + 0.5) * 72  # half a px of margin: a redraw may widen the PNG a little
        target = target / (fig.dpi * scale)
        ticks = {}
        for ax in fig.axes:
            for name, axis in (("x", ax.xaxis), ("y", ax.yaxis)):
                for which in ("major", "minor"):
                    for label in axis.get_ticklabels(which=which):
                        ticks[id(label)] = (ax, name, which)
        for t, _px in small:
            if id(t) in ticks:
                ax, name, which = ticks[id(t)]
                ax.tick_params(axis=name, which=which, labelsize=target)
            else:
                t.set_fontsize(target)
        # lay out again, unless the figure has a layout engine (it lays out at every draw) or
        # places a figure legend itself (a plain tight_layout would lay the axes over it)
        if fig.get_layout_engine() is None and not fig.legends:
            fig.tight_layout()
    if changed:
        fig.canvas.draw_idle()
    return fig


def wrap(text: str, width: int = LINE_CHARS, *, indent: str = "") -> str:
    """``text`` broken between words into lines of at most ``width`` characters (a word longer
    than ``width`` stays whole); lines after the first start with ``indent``. Existing line
    breaks are kept."""
    if not isinstance(width, int) or isinstance(width, bool) or width < 20:
        raise ValueError(f"width must be an int >= 20 (characters), got width={width!r}")
    return "\n".join(
        textwrap.fill(
            line, width, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False
        )
        or line
        for line in str(text).split("\n")
    )


def print_wrapped(*parts: object, width: int = LINE_CHARS, indent: str = "  ") -> None:
    """``print(*parts)``, wrapped at word boundaries to ``width`` characters (``wrap``)."""
    print(wrap(" ".join(str(p) for p in parts), width, indent=indent))


def _unit(unit: str) -> float:
    return UNITS[validate.choice("unit", unit, UNITS)]


def _check_mapping(name: str, value: object) -> dict[str, float]:
    if not isinstance(value, Mapping):
        raise TypeError(f"{name} must be a dict of category -> bytes, got {type(value).__name__}")
    for k, v in value.items():
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            raise TypeError(f"{name}[{k!r}] must be a number of bytes, got {v!r}")
    return dict(value)
