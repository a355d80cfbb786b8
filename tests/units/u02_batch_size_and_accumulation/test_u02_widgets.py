"""Unit 02 explorer widget (driven from Python) and the unit's plots."""

from __future__ import annotations

import pandas as pd
import pytest

from course_lib.measure.estimate import MiB
from course_lib.units.u02_batch_size_and_accumulation import plots as p2
from course_lib.units.u02_batch_size_and_accumulation.widgets import AccumulationExplorer


def test_explorer_measures_both_modes_and_reports_the_budget():
    ex = AccumulationExplorer(device="cpu", in_features=32, hidden=64)
    assert ex.result is None
    ex.micro_batch.value = 16
    ex.steps.value = 8
    ex.budget_mib.value = 1.0
    ex.run_button.click()
    df = ex.result.set_index("mode")
    assert df.loc["accumulated", "micro_batch"] == 16
    assert df.loc["full batch", "micro_batch"] == 128
    assert (
        df.loc["accumulated", "effective_batch"] == df.loc["full batch", "effective_batch"] == 128
    )
    assert df.loc["accumulated", "peak_bytes"] < df.loc["full batch", "peak_bytes"]
    for mode, row in df.iterrows():
        assert bool(row["fits"]) == (row["peak_bytes"] <= MiB)
        assert ex.messages[mode].startswith(mode)

    # shrink the budget below both peaks: both get the out-of-memory message with the numbers
    ex.budget_mib.value = 1.0 / 64  # 16 KiB, smaller than the parameters alone
    ex.run()
    assert not ex.result["fits"].any()
    for mode in ("accumulated", "full batch"):
        msg = ex.messages[mode]
        assert "out of memory (simulated)" in msg and "16.00 KiB (16,384 B) available" in msg
    assert "simulated device budget" in ex.status.value


def test_plots_return_figures():
    ops = pd.DataFrame(
        {"op": ["matmul 8", "gelu x"], "intensity": [1.5, 1.0], "flop_per_s": [1e9, 2e8]}
    )
    machine = {
        "peak_flop_per_s": 5e10,
        "bandwidth_bytes_per_s": 1e10,
        "ridge_flop_per_byte": 5.0,
        "device": "cpu",
    }
    fig = p2.plot_roofline(ops, machine)
    assert fig.axes[0].get_xscale() == "log"
    with pytest.raises(ValueError, match="ridge_flop_per_byte"):
        p2.plot_roofline(ops, {"peak_flop_per_s": 1, "bandwidth_bytes_per_s": 1})
    tp = pd.DataFrame(
        {
            "batch": [1, 2],
            "samples_per_s": [1.0, 2.0],
            "activation_bytes": [4, 8],
            "predicted_activation_bytes": [4, 8],
        }
    )
    assert len(p2.plot_throughput_vs_batch(tp).axes) == 2
    acc = pd.DataFrame(
        {
            "accumulation_steps": [1, 2, 1, 2],
            "peak_bytes": [5, 5, 5, 9],
            "median_s": [0.1, 0.2, 0.1, 0.15],
            "mode": ["accumulated", "accumulated", "full batch", "full batch"],
        }
    )
    assert len(p2.plot_accumulation(acc).axes) == 2
    probes = pd.DataFrame(
        {"batch": [8, 16, 12], "peak_bytes": [10, 30, 20], "fits": [True, False, True]}
    )
    assert len(p2.plot_batch_search(probes, 25).axes) == 1
    with pytest.raises(ValueError, match="missing columns"):
        p2.plot_batch_search(probes.drop(columns="fits"), 25)
    fig = p2.plot_budget_check(probes.assign(mode=["a", "b", "c"]), 25 * MiB, label="25 MiB")
    assert [p.get_width() for p in fig.axes[0].patches] == pytest.approx(
        [10 / MiB, 30 / MiB, 20 / MiB]
    )
    assert fig.axes[0].get_legend().get_texts()[0].get_text() == "25 MiB"
    with pytest.raises(ValueError, match="missing columns"):
        p2.plot_budget_check(probes, 25)


def test_the_budget_slider_shows_the_budget_the_result_uses():
    ex = AccumulationExplorer(device="cpu")
    # every stop reads as the number the step is checked against (6 MiB is not shown as 5.66)
    assert all(float(label) == value for label, value in ex.budget_mib.options)
    assert ex.budget_mib.label == "6" and ex.budget_mib.value == 6.0
