"""Unit 06's explorer, driven from Python, and its plots."""

from __future__ import annotations

import pandas as pd
import pytest

from course_lib.models import GPTConfig
from course_lib.units.u06_activation_checkpointing import plots, run
from course_lib.units.u06_activation_checkpointing.widgets import PolicyExplorer

SMALL = GPTConfig.tiny(n_layer=2, n_embd=32, n_head=2, block_size=16, vocab_size=32)


def test_explorer_measures_on_click():
    ex = PolicyExplorer(config=SMALL)
    assert ex.result is None
    ex.policy.value, ex.k.value, ex.batch.value = "segments", 2, 2
    ex.run_button.click()
    assert list(ex.result["case"]) == ["none", "segments k=2"]
    assert (ex.result["kept_residual"] == 0).all()
    assert "keeps" in ex.status.value


def test_explorer_reports_bad_k():
    ex = PolicyExplorer(config=SMALL)
    ex.policy.value, ex.k.value = "full", 2
    assert ex.run() is None and ex.result is None
    assert "k = 2" in ex.status.value


def test_plots_check_their_input():
    with pytest.raises(ValueError):
        plots.plot_policies(pd.DataFrame({"case": []}))
    fig = plots.plot_scale(run.scale_table())
    assert fig.axes
