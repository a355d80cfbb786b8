"""The threshold sections of units 09-12: each measured sweep's formula column, wired to
estimate.overlap with the measured link, checked by hand on a stand-in sweep (no ranks)."""

from __future__ import annotations

import pandas as pd
import pytest

from course_lib.measure import hiding


@pytest.fixture
def fake_sweep(monkeypatch):
    """speed_sweep replaced by one that records its arguments and returns a link of 1 GB/s."""
    seen = {}

    def sweep(op, xs, numel_of, flops_of, speeds, **kw):
        seen.update(op=op, xs=list(xs), numel=numel_of(xs[0]), flops=flops_of(xs[0]), kw=kw)
        summary = pd.DataFrame(
            {"speed": list(speeds), "measured": [1000.0] * len(speeds), "alpha_s": 0.0,
             "bytes_per_s": 1e9}
        )  # fmt: skip
        return pd.DataFrame(), summary

    monkeypatch.setattr(hiding, "speed_sweep", sweep)
    return seen


def test_dp(fake_sweep):
    from course_lib.units.u09_data_parallelism import run as R

    _, s = R.dp_threshold((1e12, 2e12), params=2**20)
    # T = (F/B) (N-1)/N g/2 = 1000 x 1/2 x 4/2; backward 4 N' T FLOPs on the first T, 256
    assert list(s.formula) == pytest.approx([1000, 2000])
    assert list(s.measured_over_formula) == pytest.approx([1, 0.5])
    assert fake_sweep["op"] == "all_reduce" and fake_sweep["flops"] == 4 * 2**20 * 256
    with pytest.raises(ValueError, match="params = 9: expected an int in 1024"):
        R.dp_threshold(params=9)


def test_fsdp(fake_sweep):
    from course_lib.units.u10_zero_fsdp import run as R

    _, s = R.fsdp_threshold((1e12,), shard=2**20)
    # float32 gather and reduce-scatter: max(p/2, (p+g)/4) = 2, x (F/B) x 1/2
    assert list(s.formula) == pytest.approx([1000])
    assert fake_sweep["op"] == "all_gather" and fake_sweep["numel"] == 2**20
    assert fake_sweep["flops"] == 2 * 2**21 * 256  # forward of the whole layer, 2 shards


def test_tp(fake_sweep):
    from course_lib.units.u11_tensor_parallelism import run as R

    _, s = R.tp_threshold((1e12,), tokens=4096)
    # h = (F/B) (t-1) p / 6 = 1000 x 4 / 6 with no latency
    assert list(s.formula) == pytest.approx([4000 / 6])
    assert fake_sweep["kw"]["overlap"] is False and fake_sweep["numel"] == 4096 * 128
    assert fake_sweep["flops"] == 12 * 4096 * 128**2 / 2


def test_pp(fake_sweep):
    from course_lib.units.u12_pipeline_parallelism import run as R

    _, s = R.pp_threshold((1e12,), tokens=4096, layers=2)
    # the ratio (F/B) p / (24 L h) is 1 at h = 1000 x 4 / 48
    assert list(s.formula) == pytest.approx([4000 / 48])
    assert fake_sweep["op"] == "send_recv" and fake_sweep["flops"] == 24 * 4096 * 128**2 * 2
