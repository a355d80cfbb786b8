"""Unit 12's ScheduleExplorer, driven from Python."""

from __future__ import annotations

from course_lib.units.u12_pipeline_parallelism.widgets import ScheduleExplorer


def test_explorer_runs_one_step_and_reports_bad_input():
    ex = ScheduleExplorer(schedule="gpipe", ranks=2, microbatches=2)
    assert ex.result is None  # nothing runs before Run
    ex.run_button.click()
    events, table = ex.result
    assert table.schedule.tolist() == ["gpipe"] and "predicted" in ex.status.value
    ex.schedule.value, ex.microbatches.value = "1f1b", 1
    ex.run_button.click()
    assert ex.result is None and "microbatches = 1" in ex.status.value
