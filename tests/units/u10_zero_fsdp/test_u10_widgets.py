"""Unit 10's plots and widget, driven from Python."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from course_lib.units.u10_zero_fsdp import plots as P  # noqa: E402
from course_lib.units.u10_zero_fsdp import run as R  # noqa: E402
from course_lib.units.u10_zero_fsdp.widgets import StageExplorer  # noqa: E402


def test_plots_draw_and_refuse_bad_frames():
    comm = pd.DataFrame(
        {
            "world_size": [2, 2],
            "config": ["stage 1", "stage 3"],
            "wire_bytes": [1010, 1510],
            "predicted": [1000, 1500],
            "vs_ddp": [1.01, 1.51],
        }
    )
    assert P.plot_comm(comm).axes
    with pytest.raises(ValueError, match="missing columns"):
        P.plot_comm(comm.drop(columns=["predicted"]))
    events = pd.DataFrame(
        {
            "rank": [0, 0],
            "name": ["all-gather layers.0", "forward layers.0"],
            "start": [0.0, 0.001],
            "end": [0.001, 0.002],
            "lane": ["comm", "compute"],
            "config": ["a", "a"],
        }
    )
    assert P.plot_timeline(events).axes
    with pytest.raises(
        ValueError, match=r"configs = \['b'\]: expected each one of a \('b' is not\)"
    ):
        P.plot_timeline(events, ["b"])
    assert P.plot_scale(R.scale_grid(7e9)).axes


def test_stage_explorer_runs():
    ex = StageExplorer(world_size=1)
    ex.run_button.click()
    assert ex.result is not None, ex.status.value
    assert sorted(ex.result.stage) == [0, 1, 2, 3]
    assert "measured = predicted on every rank: True" in ex.status.value
