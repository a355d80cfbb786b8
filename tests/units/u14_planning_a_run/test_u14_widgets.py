"""Unit 14's explorer, driven from Python."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

from course_lib.units.u14_planning_a_run import widgets as W  # noqa: E402


def test_plan_explorer_runs_presets_and_custom_models():
    ex = W.PlanExplorer()
    assert ex.result is None
    ex.run_button.click()
    assert ex.result is not None and ex.result.iloc[0]["rank"] == 1
    assert "Winner: TP" in ex.status.value
    ex.model.value = W.CUSTOM
    ex.layers.value, ex.hidden.value = 40, 5120
    assert ex.spec().hidden == 5120 and ex.spec().layers == 40
    ex.run_button.click()
    assert ex.result is not None and "Winner" in ex.status.value


def test_plan_explorer_says_when_nothing_fits():
    ex = W.PlanExplorer(model="Llama-2-70B", gpus=1)
    ex.run_button.click()
    assert ex.result is not None and ex.result.empty
    assert "Nothing fits" in ex.status.value
