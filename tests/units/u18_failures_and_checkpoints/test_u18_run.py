"""Unit 18's runs: damaged checkpoints named, a skipped collective timing out where each rank waits,
the scale table. Resharding, forgetting and the elastic restart run once, in lecture 18 (below)."""

from __future__ import annotations

import pytest

from course_lib.measure import estimate
from course_lib.units.u18_failures_and_checkpoints import run, run_trouble


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


# Checked once per `make test`, by lecture 18's compared cells (nbval), not again here: resharding
# 4 -> 2 -> 1 ranks bit for bit (cell 11), forgetting each part of the state diverges (cell 8), a rank
# killed under torchrun resumes from the last checkpoint to the same final loss (cell 21).


@pytest.mark.slow
def test_a_skipped_collective_times_out_and_each_rank_says_where_it_waits():
    df = run.hung_collective(timeout=4.0)
    assert list(df["rank"]) == [0, 1]
    assert list(df["waiting in"]) == ["dist.all_reduce(t)", "dist.barrier()"]
    assert all(0 < len(said) <= run_trouble.SAID_CHARS for said in df["said"])


def test_a_rank_s_message_is_shortened_to_whole_words_and_marked():
    text = (
        "[E1127 rank1] Connection closed by peer [127.0.0.1]:25753. This may indicate a "
        "possible application crash on rank 0 or a network set up issue.\nTraceback ..."
    )
    said = run_trouble._said(text)
    assert said == "Connection closed by peer [127.0.0.1]:25753. This may indicate …"
    assert len(said) <= run_trouble.SAID_CHARS
    assert run_trouble._said("[x] Timed out after 4 s\nmore") == "Timed out after 4 s"
