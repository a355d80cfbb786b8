"""The assumed matmul efficiency replaced by a measured one (plan.calibrate)."""

from __future__ import annotations

from pathlib import Path

import pytest

from course_lib import plan as P

ROOT = Path(__file__).resolve().parents[2]
BATCH = 4 * 2**20


def test_efficiency_from_the_committed_gpu_check():
    """docs/gpu-check-2026-11-27.md measured 752.9 TFLOP/s for bf16 8192^3 on an H100: over
    989 TFLOP/s, 0.7613."""
    report = ROOT / "docs" / "gpu-check-2026-11-27.md"
    assert P.efficiency_from_gpu_check(report, peak_flops=989e12) == pytest.approx(752.9 / 989)
    text = "| bf16 matmul (TFLOP/s) | 1,200.5 |\n| other | 3 |"
    assert P.efficiency_from_gpu_check(text, peak_flops=2e15) == pytest.approx(0.60025)
    with pytest.raises(ValueError, match="report = the report text: expected a row"):
        P.efficiency_from_gpu_check("| fp8 | 3 |\n", peak_flops=989e12)
    with pytest.raises(ValueError, match="share of peak_flops"):
        P.efficiency_from_gpu_check(report, peak_flops=500e12)  # a peak below the measurement


def test_fit_efficiency_finds_the_efficiency_a_step_was_predicted_with():
    model, cluster = P.model("Llama-2-70B"), P.cluster("8xH100 + 400G IB", gpus=64)
    layout = P.Layout(dp=32, tp=2, pp=1, zero=3, recompute="selective", micro_batch=1)
    planted = P.Assumptions(matmul_efficiency=0.45)
    step = P.step_time(model, cluster, layout, global_batch_tokens=BATCH, assumptions=planted)
    fitted = P.fit_efficiency(
        model, cluster, layout, global_batch_tokens=BATCH, measured_step_s=step["step_s"]
    )
    assert fitted.matmul_efficiency == pytest.approx(0.45, abs=1e-4)
    assert fitted.replace(matmul_efficiency=0.6) == P.DEFAULT_ASSUMPTIONS  # nothing else moved
    with pytest.raises(ValueError, match="measured_step_s = 0.001: expected between"):
        P.fit_efficiency(model, cluster, layout, global_batch_tokens=BATCH, measured_step_s=1e-3)


def test_a_report_path_that_names_no_file_says_so(tmp_path):
    """A learner running the lecture from another folder: the path is missing, not the row."""
    with pytest.raises(FileNotFoundError, match="report = '.*gpu-check.md': expected the path"):
        P.efficiency_from_gpu_check(str(tmp_path / "gpu-check.md"), peak_flops=989e12)
    with pytest.raises(FileNotFoundError, match="no such file"):
        P.efficiency_from_gpu_check(tmp_path / "report.txt", peak_flops=989e12)
