"""The course's minimum text size (course_lib.viz.plots.MIN_TEXT_PX, px on screen in JupyterLab
at a 1400 px page) on real course figures, the u03 log chart's limits and labels, and ``wrap``."""

from __future__ import annotations

import ast
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from course_lib.viz import plots as V  # noqa: E402

ROOT = Path(V.__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _close():
    yield
    plt.close("all")


def _smallest(fig) -> tuple[float, str]:
    px, t = min((px, t.get_text()) for t, px in V.text_px(fig))
    return px, t


def test_text_px_is_points_at_the_figure_dpi_shrunk_to_the_output_area():
    fig, ax = plt.subplots(figsize=(4, 3), dpi=100)
    ax.set_title("x", fontsize=9)
    sizes = {t.get_text(): px for t, px in V.text_px(fig)}
    assert sizes["x"] == pytest.approx(9 * 100 / 72)  # 400 px PNG: shown at its own size
    wide, ax = plt.subplots(figsize=(19.36 - 0.2, 3), dpi=100)
    ax.set_title("x", fontsize=9)
    t, px = [(t, px) for t, px in V.text_px(wide) if t.get_text() == "x"][0]
    png = (wide.get_tightbbox(wide.canvas.get_renderer()).width + 0.2) * 100
    assert px == pytest.approx(9 * 100 / 72 * V.DISPLAY_WIDTH_PX / png)  # about half


def test_style_enlarges_small_text_and_ticks_to_the_minimum():
    with V.style():
        fig, ax = plt.subplots(figsize=(16, 4))
        ax.plot([1, 2, 3], label="a line")
        ax.legend(fontsize=6)
        ax.text(1, 2, "cell value", fontsize=7)
        ax.tick_params(labelsize=6)
    px, text = _smallest(fig)
    assert px >= V.MIN_TEXT_PX - 1e-6, text
    ax.set_xlim(0, 30)  # ticks made again at the next draw keep the size
    assert _smallest(fig)[0] >= V.MIN_TEXT_PX - 1e-6
    # without style() nothing changes: the test above can fail
    raw, ax = plt.subplots(figsize=(16, 4))
    ax.text(1, 2, "cell value", fontsize=7)
    assert _smallest(raw)[0] < V.MIN_TEXT_PX


def _styled_calls() -> list[str]:
    """plt.subplots / plt.figure calls in plot modules that are neither inside ``with style()``
    nor in a function decorated ``@styled``: their text could be below the minimum."""
    bad = []
    files = [*ROOT.glob("units/*/plots.py"), *ROOT.glob("viz/*.py")]
    for path in files:
        tree = ast.parse(path.read_text())
        inside = set()  # functions called inside a `with style()` block of this module
        for w in [n for n in ast.walk(tree) if isinstance(n, ast.With)]:
            if any("style" in ast.unparse(i.context_expr) for i in w.items):
                inside |= {ast.unparse(c.func) for c in ast.walk(w) if isinstance(c, ast.Call)}
        for fn in [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]:
            if (
                any(getattr(d, "id", None) == "styled" for d in fn.decorator_list)
                or fn.name in inside
            ):
                continue
            covered = set()
            for w in [n for n in ast.walk(fn) if isinstance(n, ast.With)]:
                if any("style" in ast.unparse(i.context_expr) for i in w.items):
                    covered |= {id(n) for n in ast.walk(w)}
            for call in [n for n in ast.walk(fn) if isinstance(n, ast.Call)]:
                name = ast.unparse(call.func)
                if (
                    name in ("plt.subplots", "plt.figure")
                    and id(call) not in covered
                    and fn.name != "style"
                ):
                    bad.append(f"{path.relative_to(ROOT)}:{call.lineno} {fn.name}")
    return bad


def test_every_course_figure_is_made_under_the_course_style():
    assert _styled_calls() == []


def _rows(n):
    return [torch.tensor([10.0 * r + c for c in range(n)]) for r in range(n)]


def _u08_figures():
    from course_lib.units.u08_collectives import plots as P
    from course_lib.units.u08_collectives import run as E

    yield (
        "u08 before/after",
        P.plot_before_after(
            _rows(4), E.expected_after("all_reduce", 4), "all_reduce", bytes_sent=[1168] * 4
        ),
    )
    yield (
        "u08 primitives",
        P.plot_primitives(
            {n: {"before": _rows(4), "after": E.expected_after(n, 4)} for n in E.PRIMITIVES}
        ),
    )
    n, full = 4, float(2**4 - 1)
    records = [
        [
            {
                "phase": "input" if s == 0 else ("reduce-scatter" if s < n else "all-gather"),
                "step": s,
                "sent_chunk": None if s == 0 else 0,
                "received_chunk": None,
                "state": torch.full((n,), float(2**r) if s == 0 else full),
            }
            for s in range(2 * (n - 1) + 1)
        ]
        for r in range(n)
    ]
    yield "u08 ring steps", P.plot_ring_steps(records)


def _u13_figures():
    from course_lib.units.u13_interconnects_and_backends import plots as P

    rows = [
        {
            "collective": c,
            "world_size": w,
            "size_bytes": s,
            "time_s": 1e-4 + s / 1e9 * w,
            "busbw_GBps": s / (1e-4 + s / 1e9) / 1e9,
            "backend": "gloo",
        }
        for c in ("all_reduce", "all_gather")
        for w in (2, 4)
        for s in 2 ** np.arange(10, 25, 2)
    ]
    yield "u13 sweep", P.plot_sweep(pd.DataFrame(rows), ceiling_GBps=8.0)
    table = pd.DataFrame(
        [
            {"n_params": n, "link": link, "time_s": t * n / 1e9, "grad_bytes": 2 * n}
            for n in (7e9, 70e9)
            for link, t in (("PCIe 4", 0.5), ("NVLink", 0.02))
        ]
    )
    yield "u13 link times", P.plot_link_times(table)


def _u03_matmul():
    from course_lib.units.u03_mixed_precision import plots as P

    df = pd.DataFrame(
        [
            {"n": n, "dtype": d, "gflops": g * n / 256}
            for n in (256, 512, 1024)
            for d, g in (("fp32", 80.0), ("bf16", 9.0), ("fp16", 0.6))
        ]
    )
    return df, P.plot_matmul_speed(df)


def _u01_timeline():
    tl = pd.DataFrame(
        {
            "event": ["start", "fwd", "peak", "bwd", "step"],
            "phase": ["forward", "forward", "backward", "backward", "step"],
            "params": [4e6] * 5,
            "grads": [0, 0, 2e6, 4e6, 4e6],
            "activations": [0, 6e6, 8e6, 2e6, 0],
            "optimizer": [0, 0, 0, 0, 8e6],
        }
    )
    yield "u01 timeline", V.plot_memory_timeline(tl)
    yield (
        "measured vs predicted",
        V.plot_measured_vs_predicted({"params": 4e6, "grads": 4e6}, {"params": 4e6, "grads": 3e6}),
    )


def _u12_gantt():
    from course_lib.units.u12_pipeline_parallelism import plots as P

    rows, t = [], 0.0
    for mb in range(8):  # one long forward and backward, then many short ones: crowded labels
        for rank in range(2):
            for kind, d in (
                ("F", 0.004 if mb == 0 else 0.0004),
                ("B", 0.008 if mb == 0 else 0.0008),
            ):
                rows.append(
                    {
                        "rank": rank,
                        "lane": "compute",
                        "start": t,
                        "end": t + d,
                        "stage": rank,
                        "mb": mb,
                        "kind": kind,
                        "schedule": "gpipe",
                        "virtual": 1,
                        "repeat": 0,
                    }
                )
                t += d
    fig = P.plot_gantt(pd.DataFrame(rows))
    labels = [t.get_text() for t in fig.axes[0].texts]
    assert "F0" in labels and "F5" not in labels  # a label only where the bar holds it
    yield "u12 gantt", fig


@pytest.mark.slow
@pytest.mark.parametrize("make", [_u08_figures, _u13_figures, _u01_timeline, _u12_gantt])
def test_course_figures_show_no_text_below_the_minimum(make):
    for name, fig in make():
        px, text = _smallest(fig)
        assert px >= V.MIN_TEXT_PX - 1e-6, f"{name}: {text!r} is {px:.1f} px on screen"
        plt.close(fig)


def test_u03_log_chart_shows_every_bar_above_the_lowest_tick_with_its_value():
    df, fig = _u03_matmul()
    ax = fig.axes[0]
    lo, hi = ax.get_ylim()
    ticks = [t for t in ax.get_yticks() if lo <= t <= hi]
    heights = [p.get_height() for p in ax.patches]
    assert len(heights) == len(df)
    assert min(ticks) <= min(heights) and max(heights) < hi  # every bar rises from a labelled tick
    values = sorted(t.get_text() for t in ax.texts)
    assert len(values) == len(df) and "0.6" in values and "320" in values  # fp16, fp32 at 1024
    assert _smallest(fig)[0] >= V.MIN_TEXT_PX - 1e-6


def test_wrap_breaks_between_words_and_keeps_short_lines():
    text = "5 time / d calls each " * 12
    out = V.wrap(text, 40, indent="  ")
    assert all(len(line) <= 40 for line in out.split("\n"))
    assert out.replace("\n  ", " ").split() == text.split()  # no word cut
    assert V.wrap("short\nlines stay", 40) == "short\nlines stay"
    with pytest.raises(ValueError, match="width must be an int >= 20.*width=5"):
        V.wrap("x", 5)


def test_lecture_printed_lines_fit_the_output_area():
    """Stored printed output of every lecture: no line longer than JupyterLab's output area shows
    unwrapped at a 1400 px page (968 px / 7.8 px a character = 123). Warnings the ranks forward
    ("[rank N] ...") come from PyTorch, not from the course, and are left as they are."""
    import json

    limit = int(V.DISPLAY_WIDTH_PX // 7.83)
    long = []
    for path in sorted((ROOT.parent / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        for i, cell in enumerate(json.loads(path.read_text())["cells"]):
            for out in cell.get("outputs", []):
                if out.get("output_type") == "stream":
                    long += [
                        f"{path.name} cell {i}: {line[:60]}..."
                        for line in "".join(out["text"]).split("\n")
                        if len(line) > limit and not line.startswith("[rank ")
                    ]
    assert long == []
