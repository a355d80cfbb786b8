"""Unit 06's runs: every policy measured equals its prediction to the byte and the FLOP."""

from __future__ import annotations

import pytest

from course_lib.models import GPTConfig
from course_lib.units.u06_activation_checkpointing import run

SMALL = GPTConfig.tiny(n_layer=3, n_embd=32, n_head=2, block_size=16, vocab_size=32)


@pytest.mark.slow
def test_policy_table_is_exact_and_gradients_match():
    df = run.policy_table(SMALL, batch=2, seq=16)
    assert list(df["case"]) == [c[0] for c in run.CASES]
    assert (df["kept_residual"] == 0).all()
    assert (df["flops_measured"] == df["flops_predicted"]).all()
    assert (df["max_grad_error"] == 0).all()
    full = df.set_index("case").loc["full"]
    assert (
        1 < full["flops_ratio"] < 4 / 3
    )  # one more forward of the blocks, minus early stop and the head


def test_segment_sweep_and_tables():
    sw = run.segment_sweep(SMALL, batch=2, seq=16, ks=[1, 3])
    assert (sw["kept_measured"] == sw["kept_predicted"]).all()
    assert (
        sw["peak_measured"].iloc[1] > sw["peak_measured"].iloc[0]
    )  # a longer segment rebuilds more
    scale = run.scale_table().set_index(["model", "policy"])["kept_GB"]
    assert round(scale[("GPT-3 175B, b 1, s 2048", "none")]) == 275
    assert run.source_corrections()["formula_GB"].round(0).tolist() == [9, 490, 146, 9]
    t = run.time_overhead(SMALL, batch=2, seq=16, rounds=1)
    assert set(t["case"]) == {c[0] for c in run.CASES}


def test_cheapest_fitting_policy_and_bad_input():
    huge = run.cheapest_fitting_policy(SMALL, 2, 16, 10**9)
    assert (
        huge["recompute"] == 0
    )  # keeping every matmul output recomputes no matmul: it beats "none" on bytes
    assert run.cheapest_fitting_policy(SMALL, 2, 16, 0) is None
    with pytest.raises(ValueError, match=r"budget = -1: expected an int >= 0"):
        run.cheapest_fitting_policy(SMALL, 2, 16, -1)
    with pytest.raises(ValueError, match=r"seq = 99: expected an int in 1\.\.16"):
        run.make_batch(SMALL, 2, 99)
    with pytest.raises(ValueError, match=r"rounds = 0"):
        run.time_overhead(SMALL, rounds=0)


@pytest.mark.slow
def test_virtual_7b_table_scales_the_virtual_cluster_per_block():
    from course_lib.measure import estimate

    vt = run.virtual_7b_table(layers=4, batch=1, seq=64)
    # full checkpointing: each block keeps its bf16 input, 2 s b h bytes, on the virtual cluster
    assert vt.loc["full", "virtual_per_block_GB"] * 1e9 == 2 * 64 * 1 * 4096
    assert vt.loc["full", "virtual_per_block_GB"] < vt.loc["none", "virtual_per_block_GB"] / 10
    assert vt.loc["full", "virtual_kept_GB"] < vt.loc["none", "virtual_kept_GB"]
    assert vt.loc["full", "virtual_peak_GB"] < vt.loc["none", "virtual_peak_GB"]
    assert vt.loc["full", "estimate_kept_GB"] * 1e9 == estimate.checkpointed_activation_bytes(
        64, 1, 4096, 32, 4, policy="full"
    )
    assert all(t.startswith("virtual cluster") for t in vt.attrs["titles"])
    with pytest.raises(ValueError, match="probe"):
        run.virtual_7b_table(probe=(2, 1))
