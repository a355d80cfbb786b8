"""Unit 01 explorer widget (driven from Python) and the unit's plots."""

from __future__ import annotations

import pandas as pd
import pytest

from course_lib.units.u01_backprop_memory import plots as p1
from course_lib.units.u01_backprop_memory import run as u1
from course_lib.units.u01_backprop_memory.widgets import StepMemoryExplorer


def test_explorer_runs_a_real_measurement_on_click():
    ex = StepMemoryExplorer()
    assert ex.result is None  # nothing runs until Run is pressed
    ex.width.value = 32
    ex.batch.value = 8
    ex.optimizer.value = "momentum"
    ex.run_button.click()
    table = ex.result.set_index("category")
    # MLP 32 -> 32 -> 32 -> 10, batch 8, momentum: the measured bytes equal the formulas
    n = 2 * (32 * 32 + 32) + (32 * 10 + 10)
    assert table.loc["params", "measured"] == 4 * n
    assert table.loc["optimizer", "measured"] == 4 * n
    assert table.loc["activations", "measured"] == 4 * 8 * (32 + 32 + 10)
    assert "batch shape (8,)" in ex.status.value and "momentum" in ex.status.value
    assert {"forward", "backward", "step"} <= set(ex.timeline["phase"])
    assert not ex.run_button.disabled

    # a second run with other settings replaces the result (GPT this time)
    ex.model_kind.value = "gpt"
    ex.batch.value = 2
    ex.optimizer.value = "sgd"
    ex.run()
    table = ex.result.set_index("category")
    assert table.loc["optimizer", "measured"] == 0
    assert table.loc["activations", "residual"] == 0
    assert "gpt" in ex.status.value


def test_explorer_has_the_advertised_controls():
    ex = StepMemoryExplorer()
    assert set(ex.optimizer.options) == {"sgd", "momentum", "adam"}
    assert [v for _, v in ex.model_kind.options] == ["mlp", "gpt"]
    assert ex.run_button in ex.widget.children[1].children  # below the stored-copy note


def test_plots_return_figures_from_real_results():
    sweep = u1.scaling_sweep(batches=(4, 8), widths=(8, 16), in_features=4, depth=1)
    fig = p1.plot_scaling_sweep(sweep)
    assert len(fig.axes) == 2
    assert fig.axes[0].get_xlabel().startswith("batch")
    from course_lib.models import MLP, MLPConfig

    table = u1.optimizer_state_comparison(MLP(MLPConfig(in_features=4, hidden=(8,))), (2,))
    fig = p1.plot_optimizer_states(table)
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["sgd", "momentum", "adam"]


def test_plots_reject_bad_input():
    with pytest.raises(ValueError, match=r"missing columns \['width'"):
        p1.plot_scaling_sweep(pd.DataFrame({"batch": [1]}))
    with pytest.raises(TypeError, match="pandas DataFrame"):
        p1.plot_optimizer_states({"optimizer": ["sgd"]})
