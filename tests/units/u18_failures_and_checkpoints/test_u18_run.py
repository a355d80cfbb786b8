"""Unit 18's runs: saved on 4 ranks and continued on 2 and 1 bit for bit, a forgotten part of the
state diverging, damaged checkpoints named, a rank killed under torchrun --max-restarts 1 and the
run finishing with the uninterrupted run's final loss, the scale table."""

from __future__ import annotations

import pytest

from course_lib.measure import estimate
from course_lib.units.u18_failures_and_checkpoints import run


def test_scale_table_and_goodput_curve_need_no_ranks():
    df = run.scale_table((16384,), write_GBps=2000.0, restart_s=600.0)
    row = df.iloc[0]
    assert row["job MTBF h"] == pytest.approx(54 * 24 / 419)
    assert row["save s"] == pytest.approx(14 * 405e9 / 2e12)
    assert 0.9 < row["goodput (Young)"] < 1
    curve = run.goodput_curve(30.0, 3600.0 * 3, restart_s=600.0)
    best = curve.loc[curve.goodput.idxmax(), "interval_s"]
    daly = estimate.optimal_interval(30.0, 3600.0 * 3, method="daly")
    assert 0.8 < best / daly < 1.25  # the curve's grid is coarse


def test_bad_checkpoints_are_named_and_latest_skips_partial():
    df = run.bad_checkpoints()
    said = dict(zip(df.case, df["load says"]))
    assert said["the good checkpoint"] == "loaded"
    assert "shape (64, 16) in the checkpoint: expected (128, 16)" in said["a wider model"]
    assert (
        "'__1_0.distcp'" in said["a shard file missing"]
        and "missing" in said["a shard file missing"]
    )
    assert "(truncated)" in said["a shard file cut in half"]
    assert "partial write" in said["a write killed halfway"]
    assert said["latest() picks"] == "step_000002"


@pytest.mark.slow
def test_saved_on_4_continues_on_2_and_1_bit_for_bit_and_forgetting_diverges():
    df = run.reshard_run((4, 2, 1), steps=9)
    assert df["same"].all() and df.attrs["weights_equal"]
    assert {1, 2} <= set(df.world_size)  # continued on 2 ranks, then on 1
    summary = run.forget_summary(run.forget_table(steps=8, cut=4)).set_index("forgot")
    assert summary.loc["nothing", "bit for bit"]
    for part in ("model", "optim", "scheduler", "rng", "data"):
        assert not summary.loc[part, "bit for bit"], part
    assert summary.loc["step", "run ends at step"] == 4  # counted from 0 again


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_rank_killed_under_torchrun_resumes_to_the_same_final_loss(tmp_path):
    out = run.torchrun_elastic(tmp_path, steps=8, every=3, kill_step=5, timeout=200)
    assert out["returncode"] == 0, out["stderr"]
    tl = out["timeline"]
    assert set(tl.attempt) == {0, 1} and (tl.event == "killed").sum() == 1
    summary = run.restart_summary(tl)
    assert summary["resumed from step"] == 3 and summary["steps redone"] == 2
    ref = run.elastic_run(2, steps=8, every=3)
    assert out["losses"]["loss"].iloc[-1] == ref["loss"].iloc[-1]  # the same bits
    assert list(out["losses"]["step"]) == [4, 5, 6, 7, 8]


@pytest.mark.slow
def test_a_skipped_collective_times_out_and_each_rank_says_where_it_waits():
    df = run.hung_collective(timeout=4.0)
    assert list(df["rank"]) == [0, 1]
    assert list(df["waiting in"]) == ["dist.all_reduce(t)", "dist.barrier()"]
