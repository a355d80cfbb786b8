"""measure.hiding: the crossing of a measured sweep by hand, the refusals, and one real sweep."""

from __future__ import annotations

import math

import pytest

from course_lib.measure import hiding


def test_crossing_interpolates_on_log_x_after_two_points_below():
    # 1 at x = 2, 0.05 at x = 4 (and 0.01 after): log2 x = 1 + (1 - 0.1)/(1 - 0.05)
    x = hiding.crossing([1, 2, 4, 8], [3, 1, 0.05, 0.01], 0.1)
    assert x == pytest.approx(2 ** (1 + 0.9 / 0.95))
    # a single point below, then above again, is noise: the crossing is the later one
    assert hiding.crossing([1, 2, 4, 8, 16], [3, 0.05, 2, 0.05, 0.01], 0.1) == pytest.approx(
        2 ** (2 + 1.9 / 1.95)
    )
    assert hiding.crossing([1, 2, 4], [0.01, 0.02, 5], 0.1) == 1  # already below at the start
    assert hiding.crossing([1, 2, 4], [0.5, 0.05, 5], 0.1) != hiding.crossing(
        [1, 2, 4], [0.5, 0.05, 0.05], 0.1
    )
    assert math.isnan(hiding.crossing([1, 2, 4], [3, 2, 1], 0.1))
    assert hiding.crossing([1, 2, 4], [3, 2, 0.1], 0.1) == 4  # the last point, on the level


@pytest.mark.parametrize(
    "call, error, message",
    [
        (lambda: hiding.crossing([2, 1], [1, 0], 0.1), ValueError, r"expected >= 2 increasing"),
        (lambda: hiding.crossing([1, 2], [1], 0.1), ValueError, r"one per ratio"),
        (lambda: hiding.hiding_sweep("broadcast", [8], [0.0]), ValueError, r"op = 'broadcast'"),
        (lambda: hiding.hiding_sweep("all_reduce", [8, 8], [0.0]), ValueError, r"one per numel"),
        (lambda: hiding.hiding_sweep("all_reduce", [8], [2.0]), ValueError, r"compute_s = 2.0"),
        (lambda: hiding.hiding_sweep("all_reduce", [8], [0.0], overlap=1), TypeError, "overlap"),
        (lambda: hiding.hiding_sweep("all_reduce", [8], [0.0], world_size=1), ValueError, "2..4"),
        (lambda: hiding.hiding_sweep("all_to_all", [9], [0.0]), ValueError, r"multiples of world"),
    ],
)
def test_refusals_name_the_parameter(call, error, message):
    with pytest.raises(error, match=message):
        call()


@pytest.mark.slow
def test_a_real_sweep_on_two_ranks():
    df = hiding.hiding_sweep("send_recv", [1024, 1024], [0.0, 0.05], repeats=1)
    assert list(df.bytes) == [4096, 4096] and list(df.compute_s) == [0.0, 0.05]
    assert (df.comm_s > 0).all() and df.slept_s.iloc[1] >= 0.05
    assert (df.step_s >= df.slept_s).all()
    # without overlap the exchange comes after the sleep: the step is at least both
    seq = hiding.hiding_sweep("all_reduce", [1024], [0.02], overlap=False, repeats=1)
    assert seq.step_s.iloc[0] >= seq.slept_s.iloc[0] >= 0.02
    # an expert layer's dispatch and combine: a long compute leaves less of it exposed
    a2a = hiding.hiding_sweep("all_to_all", [1 << 20, 1 << 20], [0.0, 0.05], repeats=3)
    assert (a2a.comm_s > 0).all() and a2a.exposed_s.iloc[1] < a2a.exposed_s.iloc[0]


def _fake_sweep(times):
    import pandas as pd

    def sweep(op, numels, compute, *, overlap, repeats):
        return pd.DataFrame(
            dict(
                numel=numels,
                bytes=[4 * n for n in numels],
                compute_s=compute,
                slept_s=compute,
                comm_s=[times[n] for n in numels],
                exposed_s=[0.0] * len(numels),
                step_s=compute,
            )
        )

    return sweep


def test_the_link_is_fitted_and_a_fit_that_noise_beat_falls_back_to_the_largest_buffer(
    monkeypatch,
):
    # 1 ms + 4n bytes at 1 GB/s: the fit finds both
    monkeypatch.setattr(hiding, "hiding_sweep", _fake_sweep({1000: 1e-3 + 4e-6, 2000: 1e-3 + 8e-6}))
    _, summary = hiding.speed_sweep("send_recv", [1000, 2000], lambda x: x, float, [1.0])
    assert summary.bytes_per_s[0] == pytest.approx(1e9) and summary.alpha_s[0] == pytest.approx(
        1e-3
    )
    # a busy machine: the larger buffer came back faster (a negative slope): 8,000 B in 2 ms
    monkeypatch.setattr(hiding, "hiding_sweep", _fake_sweep({1000: 3e-3, 2000: 2e-3}))
    _, summary = hiding.speed_sweep("send_recv", [1000, 2000], lambda x: x, float, [1.0])
    assert summary.bytes_per_s[0] == pytest.approx(4e6) and summary.alpha_s[0] == 0.0
