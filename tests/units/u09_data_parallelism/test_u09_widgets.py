"""Unit 09's plots and widget, driven from Python."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from course_lib.units.u09_data_parallelism import plots as P  # noqa: E402
from course_lib.units.u09_data_parallelism.widgets import OverlapExplorer  # noqa: E402


def test_plots_draw_and_refuse_bad_frames():
    strag = pd.DataFrame(
        {"rank": [0, 1], "slow": [False, True], "compute_s": [0.001, 0.2], "step_s": [0.21, 0.21]}
    )
    assert P.plot_straggler(strag).axes
    wire = pd.DataFrame(
        {
            "world_size": [2, 2],
            "version": ["naive", "bucketed"],
            "wire_bytes": [1100, 1050],
            "predicted": [1000, 1000],
            "all_reduce_calls": [6, 1],
        }
    )
    assert P.plot_bytes(wire).axes
    with pytest.raises(ValueError, match="missing columns"):
        P.plot_bytes(wire.drop(columns=["predicted"]))
    assert P._sub_lanes([(0, 2), (1, 3), (2.5, 4)]) == [0, 1, 0]
    plt.close("all")


@pytest.mark.slow
def test_overlap_explorer_runs():
    ex = OverlapExplorer(world_size=2, small_cap=1.0, large_cap=25.0)
    ex.run_button.click()
    assert ex.result is not None, ex.status.value
    assert sorted(ex.result.summary.n_buckets) == [1, 8]
    assert "bucket(s)" in ex.status.value
    with pytest.raises(ValueError, match="implementation"):
        P.plot_overlap(ex.result.events, implementation="torch")
    plt.close("all")
