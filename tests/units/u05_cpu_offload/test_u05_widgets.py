"""Unit 05 explorer widget (driven from Python) and the unit's plots."""

from __future__ import annotations

import pandas as pd
import pytest

from course_lib.units.u05_cpu_offload import plots
from course_lib.units.u05_cpu_offload.widgets import OffloadExplorer


def test_explorer_times_steps_on_click():
    ex = OffloadExplorer(steps=2)
    assert ex.result is None
    ex.tier.value, ex.width.value, ex.batch.value = "memory", 32, 2
    ex.run_button.click()
    assert isinstance(ex.result, pd.DataFrame) and len(ex.result) == 2
    assert (ex.result["store_read"] == 0).all()  # memory tier: no file
    assert "median step" in ex.status.value and ex.predicted["serial_s"] > 0


def test_plots_draw_and_check_input():
    mem = pd.DataFrame(
        {
            "model_state_measured": [100, 30],
            "activations": [50, 50],
            "model_state_predicted": [100, 25],
        },
        index=["plain", "offloaded"],
    )
    assert plots.plot_memory_fit(mem, 120).axes
    tiers = pd.DataFrame({"GBps": [5.0, 0.5]}, index=["RAM copy", "file"])
    assert plots.plot_tiers(tiers, {"PCIe 4.0 x16": 32.0}).axes
    steps = pd.DataFrame(
        {
            "compute": [0.01],
            "to_host": [0.001],
            "host_adam": [0.002],
            "to_device": [0.001],
            "total": [0.0141],
            "plain": [0.012],
        }
    )
    assert plots.plot_step_breakdown(
        steps, predicted={"serial_s": 0.014, "overlapped_s": 0.01}
    ).axes
    with pytest.raises(ValueError, match="missing"):
        plots.plot_step_breakdown(pd.DataFrame({"compute": [1.0]}))
    with pytest.raises(TypeError):
        plots.plot_memory_fit([1, 2], 10)
