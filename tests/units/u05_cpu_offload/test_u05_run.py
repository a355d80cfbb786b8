"""Unit 05's measured runs: parity, device memory against the budget, tiers, the step's parts,
FSDP2's CPU offload in ranks, and the scale-up table."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from course_lib.measure import estimate
from course_lib.measure.budget import MemoryBudget, SimulatedOOM
from course_lib.models import GPT
from course_lib.units.u05_cpu_offload import run

SMALL = dataclasses.replace(run.CONFIG, n_layer=1, n_embd=64, block_size=16)


def test_parity_is_exact_and_parameters_moved():
    df = run.parity(steps=3, config=SMALL)
    assert (df["max_abs_diff"] == 0).all() and (df["min_param_moved"] > 0).all()
    n = df["n_params"].iloc[0]
    assert list(df["to_host_bytes"]) == [4 * n, 4 * n, 2 * n, 2 * n]  # fp32, fp32, bf16, bf16


def test_memory_fit_offload_fits_a_budget_the_plain_step_does_not():
    df = run.memory_fit(config=SMALL)
    plain, off = df.iloc[0], df.iloc[1]
    n = int(plain["n_params"])
    # model state on the device at the peak: exactly the estimate up to the step counters and
    # buffers (the causal mask): bf16 params + grads only, once offloaded
    assert off["model_state_predicted"] == 4 * n and plain["model_state_predicted"] == 16 * n
    assert 0 <= off["model_state_measured"] - off["model_state_predicted"] < 0.01 * n
    assert off["host_measured"] - off["host_predicted"] == 4 * len(list(GPT(SMALL).parameters()))
    budget = MemoryBudget((int(off["peak"]) + int(plain["peak"])) // 2)
    budget.check(int(off["peak"]))
    with pytest.raises(SimulatedOOM, match="simulated"):
        budget.check(int(plain["peak"]))


def test_tier_bandwidth_rows_and_positive():
    df = run.tier_bandwidth(1 << 20, repeat=1)
    assert list(df.index) == [
        "RAM copy",
        "file write + fsync",
        "file read, cache dropped",
        "file read, cached",
    ]
    assert (df["GBps"] > 0).all()


def test_step_breakdown_parts_add_up_to_their_own_total():
    df = run.step_breakdown(tier="file", steps=3, config=SMALL, batch=2)
    parts = df[list(run.PARTS)].sum(axis=1)
    ratio = (parts / df["total"]).median()
    assert (
        0.8 < ratio <= 1.0 + 1e-9
    )  # timed independently: the total also holds the gaps between timers
    n = sum(p.numel() for p in GPT(SMALL).parameters())
    assert (df["store_read_bytes"] == 12 * n).all() and (df["to_host_bytes"] == 4 * n).all()
    pred = run.predicted_step_times(df.median(numeric_only=True))
    assert pred["overlapped_s"] <= pred["serial_s"]


def test_step_breakdown_has_a_bytes_column_only_for_the_phases_that_moved_bytes():
    df = run.step_breakdown(tier="memory", steps=1, config=SMALL, batch=2)
    n = sum(p.numel() for p in GPT(SMALL).parameters())
    assert [c for c in df.columns if c.endswith("_bytes")] == ["to_host_bytes", "to_device_bytes"]
    assert list(df["to_host_bytes"]) == [4 * n] and list(df["to_device_bytes"]) == [4 * n]


def test_fsdp2_cpu_offload_matches_one_process():
    table, where = run.fsdp_offload_parity(steps=2)
    assert table["ok"].all(), table[~table["ok"]]
    assert set(where["type"]) == {"DTensor"} and set(where["device"]) == {"cpu"}
    assert where.loc["layers.0.weight", "local_shape"] == (16, 8)


def test_scale_up_seven_billion():
    df = run.scale_up((7e9,), tokens_per_step=4096, host_GBps=100.0)
    row = df.loc["7B"]
    assert row["host GB"] == 84 and row["each way GB"] == 14
    assert row["transfer s (each way)"] == pytest.approx(0.4375)
    assert row["host Adam s"] == pytest.approx(7e9 * 28 / 100e9)
    assert row["overlapped s"] == pytest.approx(max(row["compute s"], 0.4375, row["host Adam s"]))


def test_bad_arguments():
    with pytest.raises(ValueError, match="steps"):
        run.parity(steps=0)
    with pytest.raises(ValueError, match="tier = 'disk'"):
        run.step_breakdown(tier="disk", steps=1, config=SMALL)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_h2d_pinned_faster_than_pageable():
    df = run.h2d_bandwidth(64 << 20, repeat=3).set_index(["memory", "direction"])
    assert (
        df.loc[("pinned", "host -> device"), "GBps"]
        > df.loc[("pageable", "host -> device"), "GBps"]
    )
    assert df["GBps"].max() < 2 * estimate.link_speed("PCIe 5.0 x16").per_direction_GBps


def test_h2d_without_cuda_says_so():
    if torch.cuda.is_available():
        pytest.skip("CUDA present")
    with pytest.raises(RuntimeError, match="needs a CUDA device"):
        run.h2d_bandwidth()
