"""Unit 09's measured runs: real ranks, few launches, several assertions each."""

from __future__ import annotations

import pytest

from course_lib.measure import estimate
from course_lib.units.u09_data_parallelism import run as R


@pytest.mark.slow
def test_worked_example_on_four_ranks():
    df = R.worked_example()
    assert list(df.local_grad) == list(R.SOURCE_GRADS)
    assert df.averaged_grad.tolist() == pytest.approx([0.10] * 4, abs=1e-12)  # float64
    assert df["update"].tolist() == pytest.approx([-1e-4] * 4, abs=1e-9)


@pytest.mark.slow
def test_bytes_accumulation_and_straggler():
    wire = R.bytes_per_step((2,), width=64, bucket_cap_mb=25)
    for row in wire.itertuples():
        assert row.predicted == estimate.ring_allreduce_bytes_sent(row.grad_bytes, 2)
        assert row.model_bytes == row.predicted
        assert row.all_reduce_calls == (6 if row.version == "naive" else 1)
        if row.wire_bytes is not None:  # measured by the OS: payload plus gloo's headers
            assert 0 < row.residual <= row.all_reduce_calls * 1024
    acc = R.accumulation_traffic(world_size=2, micro_steps=3)
    for row in acc.itertuples():
        assert row.all_reduce_calls == row.buckets * (1 if row.no_sync else 3)
        assert row.grad_max_abs_err < 1e-9
    strag = R.median_step(R.straggler(world_size=2, slow_rank=1, delay_s=0.05, steps=2))
    assert (strag.step_s >= 0.05).all() and strag.set_index("rank").slow.tolist() == [False, True]


def test_course_sweep_overlaps_and_averages():
    sweep = R.ddp_bucket_sweep(
        (0.25, 25), width=256, depth=4, batch=16, warmup=1, steps=1, implementations="course"
    )
    s = sweep.summary.set_index("bucket_cap_mb")
    assert s.loc[0.25, "n_buckets"] == 4 and s.loc[25, "n_buckets"] == 1
    assert (s.grad_max_abs_err <= 1e-6).all()
    assert list(s.bucket_bytes) == list(s.logged_bucket_bytes)
    assert set(sweep.events.implementation) == {"course"}


def test_pure_helpers_and_bad_input():
    assert R.accumulation_steps_for(32, 4, 4) == 2 and R.accumulation_steps_for(32, 8, 1) == 4
    with pytest.raises(ValueError, match="train_batch_size = 30"):
        R.accumulation_steps_for(30, 4, 4)
    scale = R.scale_table((7e9,), world_size=8, links=("NVLink H100",))
    assert scale.model_state_per_rank[0] == 112 * 10**9 and not scale.fits[0]
    assert scale.allreduce_s[0] == pytest.approx(2 * 7 / 8 * 14e9 / 450e9)
    src = R.source_check()
    assert src["quoted_s"] == pytest.approx(0.0233, abs=1e-4)
    assert src["ring_s"] == pytest.approx(0.0408, abs=1e-4)
    assert src["ring_per_direction_s"] == pytest.approx(0.0817, abs=1e-4)
    with pytest.raises(ValueError, match="bucket_cap_mb"):
        R.parity((2,), bucket_cap_mb=0)
    with pytest.raises(ValueError, match="world_sizes"):
        R.bytes_per_step((1,))
    with pytest.raises(ValueError, match="slow_rank"):
        R.straggler(world_size=2, slow_rank=2)
    with pytest.raises(ValueError, match="implementations"):
        R.ddp_bucket_sweep((1,), implementations=("mine",))


def test_scaling_efficiency_with_the_sleep_stand_in():
    df = R.scaling_efficiency((1, 2), compute_s=0.05, width=64, rows=4, steps=2)
    assert list(df.world_size) == [1, 2] and df.stand_in.all()
    assert (df.step_s >= 0.05).all()  # every step waited for its stand-in kernels
    assert df.efficiency.iloc[0] == 1.0 and df.overhead_s.iloc[0] == 0.0
    assert df.samples_per_s.tolist() == pytest.approx([4 / df.step_s[0], 8 / df.step_s[1]])
    assert (df.gradient_bytes == 4 * (2 * 64 * 64 + 2 * 64 + 64 * 8 + 8)).all()
    # the all-reduce of 34 kB cannot make 2 ranks 3 times slower than 1, nor faster than 1.5x
    assert 1 / 3 < df.efficiency.iloc[1] < 1.5


def test_scaling_efficiency_bad_input():
    with pytest.raises(ValueError, match="world_sizes"):
        R.scaling_efficiency((2, 4))
    with pytest.raises(ValueError, match="compute_s"):
        R.scaling_efficiency(compute_s=2.0)
    with pytest.raises(ValueError, match="stand_in"):
        R.scaling_efficiency(stand_in="yes")
