"""Unit 16's plots and widget, driven from Python."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from course_lib.units.u16_mixture_of_experts import plots as P  # noqa: E402
from course_lib.units.u16_mixture_of_experts.widgets import RoutingExplorer  # noqa: E402


def test_plots_draw_and_refuse_bad_frames():
    tr = pd.DataFrame(
        [
            {"balancing": b, "capacity_factor": cf, "step": s, "busiest_share": 0.5,
             "task_loss": 1.0 / (s + 1), "dropped": 0.1}
            for b in ("none", "bias") for cf in (None, 1.0) for s in range(5)
        ]
    )  # fmt: skip
    wire = pd.DataFrame(
        [
            {"ep": 2, "rank": r, "router": "softmax", "capacity_factor": None, "phase": ph,
             "predicted": 100, "sent": 100, "wire": 244}
            for r in range(2) for ph in ("forward", "backward")
        ]
    )  # fmt: skip
    tl = pd.DataFrame(
        [
            {"hot": h, "repeat": 1, "rank": r, "phase": ph, "start": 0.001 * i,
             "end": 0.001 * i + 0.0005, "rows": 10}
            for h in (0.0, 1.0) for r in range(2)
            for i, ph in enumerate(("route", "dispatch", "experts", "combine"))
        ]
    )  # fmt: skip
    figs = [P.plot_training(tr), P.plot_capacity(tr), P.plot_bytes(wire), P.plot_timeline(tl)]
    assert all(f.axes for f in figs)
    for f in figs:
        plt.close(f)
    with pytest.raises(ValueError, match="rows"):
        P.plot_timeline(tl.drop(columns="rows"))


@pytest.mark.slow
def test_routing_explorer_runs():
    ex = RoutingExplorer(world_size=2, tokens=512, hot=1.0)
    ex.run_button.click()
    assert ex.result is not None and set(ex.result.hot) == {0.0, 1.0}
    assert "busiest rank's experts got 1024 rows" in ex.status.value
