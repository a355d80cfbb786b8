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


def test_only_the_controls_that_apply_are_shown_and_each_changes_the_plan():
    """Issue 26 item 4: a preset fixes layers and hidden (their sliders are hidden); seq applies."""
    ex = W.PlanExplorer(model="Llama-2-70B", gpus=64)
    assert ex.layers.layout.display == "none" and ex.hidden.layout.display == "none"
    assert ex.seq.value == ex.spec().seq == 4096  # the preset's own length
    ex.run_button.click()
    columns = ["dp", "tp", "pp", "zero", "micro_batch", "memory_GB", "step_s"]
    at_4k = ex.result[columns].iloc[0].tolist()
    ex.seq.value = 8192
    assert ex.spec().seq == 8192 and ex.spec().layers == 80
    ex.run_button.click()
    assert ex.result[columns].iloc[0].tolist() != at_4k  # the winner or its numbers move
    ex.model.value = W.CUSTOM
    assert ex.layers.layout.display is None and ex.hidden.layout.display is None
    ex.model.value = "Llama-2-7B"
    assert ex.layers.layout.display == "none"
