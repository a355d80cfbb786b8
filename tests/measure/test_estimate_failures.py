"""estimate.failures: Young's and Daly's intervals, goodput, a job's MTBF, checkpoint bytes."""

from __future__ import annotations

import math

import numpy as np
import pytest

from course_lib.measure import estimate


def test_young_and_daly():
    assert estimate.optimal_interval(8.0, 3600.0) == pytest.approx(math.sqrt(2 * 8 * 3600))
    young = estimate.optimal_interval(60.0, 36000.0)
    daly = estimate.optimal_interval(60.0, 36000.0, method="daly")
    x = 60 / 72000
    assert daly == pytest.approx(young * (1 + math.sqrt(x) / 3 + x / 9) - 60)
    assert abs(daly - young) / young < 0.05  # small delta / M: the two agree
    assert estimate.optimal_interval(10.0, 4.0, method="daly") == 4.0  # delta >= 2M: M


def test_goodput_limits_and_its_peak_is_dalys_interval():
    assert estimate.goodput(100.0, 10.0, 1e15) == pytest.approx(100 / 110)  # no failures
    assert estimate.goodput(100.0, 0.0, 1e15) == pytest.approx(1.0)
    save, mtbf, restart = 30.0, 3 * 3600.0, 600.0
    taus = np.geomspace(60, 20000, 4000)
    best = taus[np.argmax([estimate.goodput(t, save, mtbf, restart_s=restart) for t in taus])]
    daly = estimate.optimal_interval(save, mtbf, method="daly")
    assert abs(best - daly) / daly < 0.01
    # the restart cost lowers goodput but does not move the optimum
    assert estimate.goodput(daly, save, mtbf, restart_s=restart) < estimate.goodput(
        daly, save, mtbf
    )


def test_llama3_numbers():
    assert estimate.job_mtbf(54 * 86400, 419) / 3600 == pytest.approx(3.093, abs=1e-3)
    assert estimate.checkpoint_size_bytes(405_000_000_000) == 14 * 405_000_000_000
    assert estimate.checkpoint_size_bytes(10, param_bytes=0, master_bytes=4) == 120


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match=r"save_s = -1: expected a number > 0"):
        estimate.optimal_interval(-1, 10)
    with pytest.raises(ValueError, match=r"method = 'pi': expected one of young, daly"):
        estimate.optimal_interval(1, 10, method="pi")
    with pytest.raises(ValueError, match=r"restart_s = -5: expected a number >= 0"):
        estimate.goodput(10, 1, 100, restart_s=-5)
    with pytest.raises(ValueError, match=r"interruptions = 0: expected"):
        estimate.job_mtbf(10, 0)
    with pytest.raises(TypeError, match=r"mtbf_s = '3': expected a number"):
        estimate.goodput(10, 1, "3")
