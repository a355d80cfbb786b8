"""Unit 17's explorer (driven from Python) and plots."""

from __future__ import annotations

import pandas as pd

from course_lib.units.u17_fp8_training import plots as P
from course_lib.units.u17_fp8_training.widgets import OutlierExplorer


def test_explorer_casts_on_click():
    ex = OutlierExplorer()
    assert ex.result is None
    ex.largest.value = 2
    ex.block.value = 16
    ex.run_button.click()
    df = ex.result
    assert sorted(df["outlier x"].unique()) == [1, 10, 100]
    assert "blockwise 1x16" in set(df.cast)
    assert "error of the other channels" in ex.status.value


def test_plots_draw():
    P.plot_curves(pd.DataFrame({"precision": ["fp32", "fp32"], "step": [0, 1], "loss": [2.0, 1.0]}))
    P.plot_spike(pd.DataFrame({"step": [0, 1], "scaling": ["a", "a"], "output error": [0.1, 0.2]}))
    P.plot_allgather(
        pd.DataFrame(
            {"gather": ["bf16", "fp8"], "predicted": [100, 60], "wire (measured)": [101, 61]}
        )
    )
