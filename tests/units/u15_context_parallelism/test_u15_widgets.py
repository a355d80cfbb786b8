"""Unit 15's plots and widget, driven from Python."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from course_lib.units.u15_context_parallelism import plots as P  # noqa: E402
from course_lib.units.u15_context_parallelism import run  # noqa: E402
from course_lib.units.u15_context_parallelism.widgets import RingExplorer  # noqa: E402


def test_plots_draw_and_refuse_bad_frames():
    figs = [P.plot_layouts(run.layouts(4, 16)), P.plot_scale(run.llama3_scale())]
    wire = pd.DataFrame(
        [
            {
                "cp": 2,
                "method": m,
                "layout": "zigzag",
                "phase": ph,
                "predicted": 100,
                "sent": 100,
                "wire": 300,
            }
            for m in ("ring", "allgather")
            for ph in ("forward", "backward")
        ]
    )
    figs.append(P.plot_bytes(wire))
    saved = pd.DataFrame(
        [
            {"seq": s, "kind": k, "measured": s * s, "predicted": s * s}
            for s in (8, 16)
            for k in "ab"
        ]
    )
    figs.append(P.plot_saved(saved))
    tl = pd.DataFrame(
        [
            {
                "layout": lay,
                "repeat": 1,
                "rank": r,
                "phase": ph,
                "step": 0,
                "kind": k,
                "start": 0.001 * r,
                "end": 0.002 * r + 0.001,
                "blocks": 1,
            }
            for lay in ("contiguous", "zigzag")
            for r in range(2)
            for ph in ("forward", "backward")
            for k in ("compute", "wait")
        ]
    )
    figs.append(P.plot_timeline(tl))
    assert all(f.axes for f in figs)
    for f in figs:
        plt.close(f)
    with pytest.raises(ValueError, match="tokens"):
        P.plot_layouts(pd.DataFrame({"layout": ["zigzag"], "rank": [0]}))


@pytest.mark.slow
def test_ring_explorer_runs():
    ex = RingExplorer(world_size=2, seq=384)
    ex.run_button.click()
    assert ex.result is not None and set(ex.result.layout) == {"contiguous", "zigzag"}
    assert "zigzag" in ex.status.value
