"""Unit 18's explorer (driven from Python) and plots."""

from __future__ import annotations

import pandas as pd

from course_lib.units.u18_failures_and_checkpoints import plots as P
from course_lib.units.u18_failures_and_checkpoints.widgets import GoodputExplorer


def test_explorer_computes_on_click():
    ex = GoodputExplorer()
    assert ex.result is None
    ex.gpus.value = 32768
    ex.run_button.click()
    row = ex.result["row"]
    assert int(row["GPUs"]) == 32768 and 0 < row["goodput (Young)"] < 1
    assert "Young's interval" in ex.status.value


def test_plots_draw():
    P.plot_forget(
        pd.DataFrame(
            {
                "forgot": ["nothing", "rng"],
                "step": [1, 1],
                "loss": [2.0, 2.1],
                "uninterrupted": [2.0, 2.0],
            }
        )
    )
    P.plot_timeline(
        pd.DataFrame(
            {
                "t": [0.0, 1.0, 2.0],
                "rank": [0, 0, 1],
                "attempt": [0, 0, 1],
                "event": ["start", "step", "loaded"],
            }
        )
    )
    P.plot_losses(pd.DataFrame({"step": [1, 2], "loss": [2.0, 1.0]}))
    P.plot_cost(
        pd.DataFrame(
            {
                "params": [10, 100],
                "bytes on disk": [200, 1300],
                "predicted bytes": [120, 1200],
                "blocking s": [0.1, 0.2],
                "async: loop blocked s": [0.05, 0.06],
            }
        )
    )
    P.plot_goodput(
        {"a": pd.DataFrame({"interval_s": [60, 600], "goodput": [0.8, 0.9]})}, {"Young": 300}
    )
