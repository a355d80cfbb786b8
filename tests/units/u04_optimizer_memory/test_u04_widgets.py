"""Unit 04 explorer widget (driven from Python) and the unit's plots."""

from __future__ import annotations

import pandas as pd
import pytest

from course_lib.models import GPTConfig
from course_lib.units.u04_optimizer_memory import plots as p4
from course_lib.units.u04_optimizer_memory import run as E
from course_lib.units.u04_optimizer_memory.widgets import OptimizerExplorer

SMALL = GPTConfig.tiny(n_layer=1, n_embd=32, n_head=2, block_size=16, vocab_size=32)


def test_explorer_trains_and_measures_on_click():
    ex = OptimizerExplorer(config=SMALL)
    assert ex.result is None and ex.state is None
    ex.optimizers.value = ("sgd", "momentum")
    ex.steps.value = 5
    ex.run_button.click()
    assert list(ex.result["optimizer"].unique()) == ["sgd", "momentum"]
    assert ex.result.groupby("optimizer").size().tolist() == [5, 5]
    state = ex.state.set_index("optimizer")
    assert state.loc["sgd", "measured"] == 0
    assert state.loc["momentum", "measured"] == 4 * state.loc["momentum", "n_params"]
    assert "final loss" in ex.status.value
    # the lr multiplier reaches the run
    ex.lr_scale.value = 0.1
    ex.run_button.click()
    assert ex.result.set_index("optimizer")["lr"].iloc[0] == pytest.approx(
        E.DEFAULT_LR["sgd"] * 0.1
    )
    ex.optimizers.value = ()
    with pytest.raises(ValueError, match="optimizers is empty"):
        ex.run()


def test_plots_return_figures_and_reject_bad_input():
    state = pd.DataFrame(
        {
            "optimizer": ["sgd", "adam"],
            "n_params": [10, 10],
            "predicted": [0, 80],
            "measured": [0, 84],
        }
    )
    assert len(p4.plot_state_bytes(state).axes) == 1
    assert len(p4.plot_accounting(E.accounting_table()).axes) == 1
    mp = pd.DataFrame(
        {"params (16-bit)": [2.0, 2.0], "master (fp32)": [4.0, 4.0], "total": [6.0, 6.0]},
        index=["predicted", "measured"],
    )
    assert len(p4.plot_mixed_precision_accounting(mp).axes) == 1
    conv = pd.DataFrame(
        {"optimizer": ["sgd", "sgd"], "lr": [0.1, 0.1], "step": [0, 1], "loss": [2.0, 1.5]}
    )
    assert len(p4.plot_convergence(conv, loss_floor=0.0).axes) == 1
    with pytest.raises(ValueError, match="missing columns"):
        p4.plot_state_bytes(state.drop(columns="measured"))
