"""Unit 10's measured runs: parity with PyTorch's ZeRO and FSDP2, exact memory, wire bytes, the
stage-3 timeline, and the sources' figures through estimate."""

from __future__ import annotations

import pytest

from course_lib.units.u10_zero_fsdp import run as R


@pytest.mark.slow
def test_ours_and_torchs_train_the_same_model():
    df = R.torch_parity(world_size=2, steps=2).set_index("implementation")
    assert df.ok.all()
    ours = df.dropna(subset=["twin"])
    assert list(ours.twin) == [
        "ZeroRedundancyOptimizer",
        "fully_shard(reshard_after_forward=False)",
        "fully_shard(reshard_after_forward=True)",
    ]
    assert (ours.loss_diff < 1e-12).all()  # float64: same losses to the last bits


def test_memory_measured_equals_the_padded_layout():
    df = R.memory_table((2,))
    assert (df.residual == 0).all()
    r0 = df[df["rank"] == 0].set_index("stage")
    assert list(r0.padding) == [
        0,
        8,
        10,
        8,
    ]  # one padded element: 4 B of params + 4 B of state (2 x half)
    assert r0.total[3] < r0.total[2] < r0.total[1] < r0.total[0]


def test_traffic_stage3_is_one_and_a_half_ddp():
    df = R.comm_table((2,), (0, 1, 3), with_torch=False)
    assert df.wire_bytes.notna().all()
    g = df.groupby("config").vs_ddp.median()
    assert g["stage 1"] == pytest.approx(1.0, abs=0.02)
    assert g["stage 3"] == pytest.approx(1.5, abs=0.03)
    assert g["stage 3, keep after forward"] == pytest.approx(1.0, abs=0.02)
    assert (df.residual >= 0).all() and (df.residual < 0.03 * df.predicted).all()


def test_fsdp_timeline_prefetch_and_reshard():
    events, summary = R.fsdp_timeline(
        ("reshard, prefetch", "keep, no prefetch"), width=96, depth=6, batch=8
    )
    s = summary[summary["rank"] == 0].set_index("config")
    assert s.all_gathers["reshard, prefetch"] == 14 and s.all_gathers["keep, no prefetch"] == 7
    assert s.peak_bytes["keep, no prefetch"] > s.peak_bytes["reshard, prefetch"]
    ev = events[(events.config == "reshard, prefetch") & (events["rank"] == 0)]
    start = dict(zip(ev.name, ev.start))  # the last span of each name
    # prefetch: layer 1's gather is launched before layer 0's forward starts
    first = (
        ev[ev.name.isin(["all-gather layers.1", "forward layers.0"])].groupby("name").start.min()
    )
    assert first["all-gather layers.1"] <= first["forward layers.0"]
    assert "reduce-scatter layers.0" in start


def test_scale_and_sources():
    grid = R.scale_grid(7e9)
    assert list(grid["N=8"]) == [112, 38.5, 26.25, 14]
    assert list(grid.loc["stage 1"]) == [112, 70, 49, 38.5, 33.25]
    src = R.source_checks().set_index("claim")
    assert src.recomputed["7.5B on 64 GPUs, stages 0-3 (GB)"] == "120 / 31.406 / 16.641 / 1.875"
    assert src.recomputed["ZeRO-3 traffic vs DDP (one micro-batch per step)"] == "1.5x"
    assert R.smallest_stage(7e9, 8, 80) == 1 and R.smallest_stage(70e9, 8, 80) is None
    with pytest.raises(ValueError, match=r"stages\[i\] = 5: expected one of 0, 1, 2, 3"):
        R.memory_table((2,), (5,))


def _accumulation_checks(df, n, ks):
    """Measured wire bytes per optimizer step against the formula, with the residual explained
    to the byte: gloo frames every ring step with 96 B at the sender + 48 B at the receiver."""
    assert df.wire_bytes.notna().all()
    assert (df.payload_bytes == df.predicted).all()  # the calls really made, modelled = formula
    assert (df.residual > 0).all() and (df.residual < 0.03 * df.predicted).all()
    r = df[df["rank"] == 0].set_index(["config", "K"])
    n_units = len(R.units_of(R._memory_model()))
    for k in ks:
        # DDP with no_sync and stage 1 send the same bytes whatever K (the wire, to the byte)
        assert r.wire_bytes[("DDP, no_sync", k)] == r.wire_bytes[("DDP, no_sync", 1)]
        assert r.wire_bytes[("stage 1", k)] == r.wire_bytes[("stage 1", 1)]
        # stage 2: one more reduce-scatter of every unit per extra micro-batch, headers included
        extra = r.predicted[("stage 2", k)] - r.predicted[("stage 2", 1)]
        headers = (k - 1) * n_units * (n - 1) * 144
        assert r.wire_bytes[("stage 2", k)] - r.wire_bytes[("stage 2", 1)] == extra + headers
        # stage 3: K times the one-micro-batch step
        assert r.wire_bytes[("stage 3", k)] == k * r.wire_bytes[("stage 3", 1)]
        assert r.vs_ddp[("stage 3", k)] == pytest.approx(1.5 * k, rel=0.05)
        assert r.vs_ddp[("stage 2", k)] == pytest.approx((k + 1) / 2, rel=0.05)


def test_accumulation_wire_bytes_two_ranks():
    df = R.accumulation_comm_table((1, 3), world_size=2)
    assert sorted(set(df.K)) == [1, 3] and set(df.config) == set(R.ACCUM_CONFIGS)
    _accumulation_checks(df, 2, (1, 3))


@pytest.mark.slow
def test_accumulation_wire_bytes_four_ranks():
    _accumulation_checks(R.accumulation_comm_table((1, 2, 4), world_size=4), 4, (1, 2, 4))


def test_accumulation_bad_input():
    with pytest.raises(ValueError, match="micro_batches"):
        R.accumulation_comm_table((0,))
    with pytest.raises(ValueError, match="world_size"):
        R.accumulation_comm_table(world_size=1)
    with pytest.raises(ValueError, match="configs"):
        R.accumulation_comm_table(configs=("stage 5",))
