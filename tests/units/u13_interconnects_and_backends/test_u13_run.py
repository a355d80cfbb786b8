"""Unit 13 experiments and grading: real gloo ranks, results checked against definitions,
estimate, DDP's own logging data and a single-process reference."""

from __future__ import annotations

import math
import stat

import numpy as np
import pandas as pd
import psutil
import pytest
import torch

from course_lib.measure import estimate
from course_lib.units.u13_interconnects_and_backends import run as E

KiB, MiB = estimate.KiB, estimate.MiB


def _no_leftover_ranks():
    from course_lib.runtime.launch import helper_pids

    children = {p.pid for p in psutil.Process().children(recursive=True)}
    helpers = helper_pids()
    leaked = [
        pid
        for pid in children - helpers
        if psutil.pid_exists(pid) and psutil.Process(pid).ppid() not in helpers
    ]
    assert not leaked, f"processes left behind: {leaked}"


# ----------------------------------------------------------------------------- the sweep
@pytest.fixture(scope="module")
def sweep2():
    cfg = E.SweepConfig(
        world_sizes=(2,),
        min_bytes=KiB,
        max_bytes=64 * KiB,
        factor=4,
        warmup=1,
        repeat=3,
        backend="gloo",
    )
    return E.collective_sweep(cfg, progress=False)


@pytest.mark.slow
def test_sweep_is_tidy_and_follows_the_nccl_tests_convention(sweep2):
    assert list(sweep2.columns) == [
        "backend",
        "collective",
        "world_size",
        "size_bytes",
        "time_s",
        "time_min_s",
        "time_max_s",
        "repeat",
        "algbw_GBps",
        "busbw_GBps",
    ]
    assert len(sweep2) == 3 * 4  # 3 collectives x sizes 1, 4, 16, 64 KiB
    assert set(sweep2["backend"]) == {"gloo"}
    assert sorted(sweep2["size_bytes"].unique()) == [KiB, 4 * KiB, 16 * KiB, 64 * KiB]
    assert (sweep2["time_min_s"] <= sweep2["time_s"]).all()
    assert (sweep2["time_s"] <= sweep2["time_max_s"]).all()
    # algbw = S / t (GB/s); busbw = algbw * 2(n-1)/n for all-reduce, (n-1)/n otherwise
    np.testing.assert_allclose(
        sweep2["algbw_GBps"], sweep2["size_bytes"] / sweep2["time_s"] / 1e9, rtol=1e-12
    )
    factor = sweep2["collective"].map({"all_reduce": 1.0, "all_gather": 0.5, "reduce_scatter": 0.5})
    np.testing.assert_allclose(sweep2["busbw_GBps"], sweep2["algbw_GBps"] * factor, rtol=1e-12)
    _no_leftover_ranks()


def test_four_ranks_round_sizes_to_whole_shards():
    cfg = E.SweepConfig(
        collectives=("reduce_scatter",),
        world_sizes=(4,),
        min_bytes=KiB,
        max_bytes=2 * KiB,
        factor=2,
        warmup=0,
        repeat=1,
        dtype="bfloat16",
    )
    df = E.collective_sweep(cfg, progress=False)
    assert df["size_bytes"].tolist() == [KiB, 2 * KiB]  # 512 bf16 elements: 4 shards of 128
    np.testing.assert_allclose(df["busbw_GBps"], df["algbw_GBps"] * 3 / 4)
    _no_leftover_ranks()


def _check_with_a_broken_collective(rank, world_size, collective):
    """In a rank: replace the collective by one that does nothing; the check must notice."""
    from course_lib.units.u13_interconnects_and_backends import run_sweep

    run_sweep._collective_op = lambda *args: lambda: None
    full, shard = torch.empty(8), torch.empty(8 // world_size)
    run_sweep._check_collective(collective, full, shard, rank, world_size)


@pytest.mark.slow
def test_the_sweep_refuses_to_time_a_collective_that_computes_the_wrong_thing():
    from course_lib import LaunchError, launch

    for collective in E.SWEEP_COLLECTIVES:
        with pytest.raises(LaunchError, match=f"{collective} returned wrong values"):
            launch(_check_with_a_broken_collective, 2, collective, backend="gloo", timeout=30)


def test_sweep_config_rejects_bad_values_naming_them():
    with pytest.raises(ValueError, match="collectives = .*'allreduce' is not"):
        E.SweepConfig(collectives=("allreduce",))
    with pytest.raises(
        ValueError, match=r"world_sizes = \[1, 2\]: expected a non-empty list of ints >= 2"
    ):
        E.SweepConfig(world_sizes=(1, 2))
    with pytest.raises(ValueError, match="max_bytes = 512: expected an int >= 1024"):
        E.SweepConfig(max_bytes=512)
    with pytest.raises(ValueError, match="dtype = 'int8': expected one of float32"):
        E.SweepConfig(dtype="int8")
    with pytest.raises(ValueError, match="backend = 'mpi': expected one of auto, gloo, nccl"):
        E.SweepConfig(backend="mpi")
    with pytest.raises(TypeError, match="config must be a SweepConfig"):
        E.collective_sweep({"world_sizes": (2,)})
    with pytest.raises(ValueError, match="nccl"):  # refused here, before any process starts
        if torch.cuda.device_count() >= 2:
            pytest.skip("this machine can run NCCL on 2 ranks")
        E.collective_sweep(E.SweepConfig(world_sizes=(2,), backend="nccl"), progress=False)


def test_sizes_and_full_sweep():
    assert E.sweep_sizes(KiB, 16 * KiB, 4) == [KiB, 4 * KiB, 16 * KiB]
    assert E.sweep_sizes(KiB, 15 * KiB, 2) == [KiB, 2 * KiB, 4 * KiB, 8 * KiB]
    full = E.SweepConfig.full()
    assert full.sizes()[0] == KiB and full.sizes()[-1] == 256 * MiB and len(full.sizes()) == 19
    with pytest.raises(ValueError, match="factor = 1: expected an int >= 2"):
        E.sweep_sizes(KiB, MiB, 1)


# ----------------------------------------------------------------------------- fits
def _synthetic(alpha=50e-6, beta=1e-9, world_sizes=(2, 4)):
    rows = []
    for ws in world_sizes:
        for s in E.sweep_sizes(KiB, MiB, 4):
            rows.append(
                {
                    "collective": "all_reduce",
                    "world_size": ws,
                    "size_bytes": s,
                    "time_s": ws * alpha + beta * s,
                }
            )
    return pd.DataFrame(rows)


def test_fit_recovers_a_known_line_and_residuals_vanish():
    df = _synthetic()
    fits = E.fit_sweep(df)
    assert fits["world_size"].tolist() == [2, 4]
    np.testing.assert_allclose(fits["alpha_s"], [100e-6, 200e-6], rtol=1e-9)
    np.testing.assert_allclose(fits["beta_s_per_byte"], [1e-9, 1e-9], rtol=1e-9)
    np.testing.assert_allclose(fits["algbw_fit_GBps"], [1.0, 1.0], rtol=1e-9)
    np.testing.assert_allclose(fits["busbw_fit_GBps"], [1.0, 1.5], rtol=1e-9)  # 2(n-1)/n
    res = E.sweep_residuals(df, fits)
    assert np.abs(res["residual_pct"]).max() < 1e-6
    np.testing.assert_allclose(res["predicted_s"], df["time_s"], rtol=1e-9)


def test_fit_without_bandwidth_says_nan_and_bad_frames_are_refused():
    df = _synthetic(beta=0.0).assign(time_s=lambda d: 1e-3 - d["size_bytes"] * 1e-12)
    assert math.isnan(E.fit_sweep(df)["algbw_fit_GBps"].iloc[0])
    with pytest.raises(TypeError, match="DataFrame"):
        E.fit_sweep([1, 2, 3])
    with pytest.raises(ValueError, match="time_s"):
        E.fit_sweep(df.drop(columns=["time_s"]))


# ----------------------------------------------------------------------------- predictions
def test_link_table_and_gradient_times_reproduce_the_published_example():
    links = E.link_table()
    assert {"NVLink H100", "InfiniBand NDR", "PCIe 4.0 x16"} <= set(links["link"])
    assert links["source"].str.len().min() > 0
    t = E.gradient_allreduce_table((1e9, 7e9), dtype="bf16", world_size=8)
    one_b = t[t["n_params"] == 10**9].set_index("link")
    assert one_b.loc["NVLink H100", "grad_bytes"] == 2 * 10**9
    assert one_b.loc["NVLink H100", "time_s"] == pytest.approx(
        7.78e-3, rel=1e-3
    )  # 450 GB/s each way
    assert one_b.loc["InfiniBand NDR", "time_s"] == pytest.approx(70e-3, rel=1e-9)  # 70 ms
    assert one_b.loc["NVLink H100", "time_headline_s"] == pytest.approx(
        3.89e-3, rel=1e-3
    )  # the source's 3.9 ms
    assert one_b.loc["InfiniBand NDR", "time_headline_s"] == one_b.loc["InfiniBand NDR", "time_s"]
    seven = t[t["n_params"] == 7 * 10**9].set_index("link")
    np.testing.assert_allclose(seven["time_s"], 7 * one_b["time_s"], rtol=1e-12)


def test_hierarchical_allreduce_matches_the_ring_on_one_node_and_wins_on_latency():
    s, g = 2 * 10**9, 8
    one_node = estimate.hierarchical_allreduce_breakdown(
        s, nodes=1, gpus_per_node=g, intra_GBps=450, inter_GBps=50, alpha_intra=5e-6
    )
    ring = estimate.allreduce_time(s, g, alpha=5e-6, bandwidth=450e9)
    assert one_node["allreduce_inter_s"] == 0.0
    assert one_node["hierarchical_s"] == pytest.approx(ring, rel=1e-12)
    kw = dict(
        nodes=4, gpus_per_node=g, intra_GBps=450, inter_GBps=50, alpha_intra=5e-6, alpha_inter=20e-6
    )
    big = estimate.hierarchical_allreduce_breakdown(s, **kw)
    assert big["allreduce_inter_s"] == pytest.approx(
        estimate.allreduce_time(s / g, 4, alpha=20e-6, bandwidth=50e9), rel=1e-12
    )
    assert big["flat_rings_s"] == pytest.approx(
        2 * 31 * 20e-6 + 2 * 31 / 32 * (s / g) / 50e9, rel=1e-12
    )  # 8 rings of S/8 bytes
    assert big["hierarchical_s"] == pytest.approx(
        2 * big["reduce_scatter_intra_s"] + big["allreduce_inter_s"], rel=1e-12
    )
    small = estimate.hierarchical_allreduce_breakdown(MiB, **kw)
    assert small["hierarchical_s"] < small["flat_rings_s"]  # latency-bound: fewer slow steps
    assert big["flat_rings_s"] < big["hierarchical_s"]  # bandwidth-bound: intra phases cost
    with pytest.raises(ValueError, match="nodes"):
        estimate.hierarchical_allreduce_breakdown(
            s, nodes=0, gpus_per_node=8, intra_GBps=1, inter_GBps=1
        )


def test_topology_report_runs_nvidia_smi_or_labels_the_example(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi here
    rep = E.topology_report()
    assert rep["measured"] is False and "EXAMPLE" in rep["source"]
    assert "NV#  = Connection traversing a bonded set of # NVLinks" in rep["text"]
    fake = tmp_path / "nvidia-smi"
    fake.write_text('#!/bin/sh\necho "GPU0 X PHB"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    rep = E.topology_report()
    assert rep == {"measured": True, "source": f"{fake} topo -m", "text": "GPU0 X PHB\n"}


def test_backend_report_says_what_this_build_has():
    rep = E.backend_report()
    assert rep["gloo"] is torch.distributed.is_gloo_available()
    assert rep["nccl"] is torch.distributed.is_nccl_available()
    assert rep["cuda_devices"] == (torch.cuda.device_count() if torch.cuda.is_available() else 0)
    assert rep["multi_rank_backend"] in ("gloo", "nccl")
    assert rep["both_on_gpus"] == (rep["nccl"] and rep["cuda_devices"] >= 2)


def test_memcpy_bandwidth_is_one_thread_and_restores_the_setting():
    before = torch.get_num_threads()
    res = E.memcpy_bandwidth(4 * MiB, warmup=1, repeat=3)
    assert torch.get_num_threads() == before
    assert res["size_bytes"] == 4 * MiB
    assert res["GBps"] == pytest.approx(res["size_bytes"] / res["time_s"] / 1e9)
    assert res["time_min_s"] <= res["time_s"] <= res["time_max_s"]
    with pytest.raises(ValueError, match="repeat"):
        E.memcpy_bandwidth(MiB, repeat=0)


# ----------------------------------------------------------------------------- held out, placement
def test_heldout_fit_predicts_sizes_it_did_not_fit():
    sizes = [KiB * 4**k for k in range(6)]
    # times on an exact line except the held-out sizes, which are off by +50 %: a fit that used
    # them would not predict the line; a held-out fit recovers it and reports the 50 %
    times = [1e-4 + s * 1e-9 for s in sizes]
    rows = [
        {
            "collective": "all_reduce",
            "world_size": 2,
            "size_bytes": s,
            "time_s": t * (1.5 if i in (1, 3) else 1.0),
        }
        for i, (s, t) in enumerate(zip(sizes, times))
    ]
    out = E.heldout_fit(pd.DataFrame(rows), every=2)
    assert out["size_bytes"].tolist() == [sizes[1], sizes[3]]  # first and last are always fitted
    np.testing.assert_allclose(out["predicted_s"], [times[1], times[3]], rtol=1e-9)
    np.testing.assert_allclose(out["error_pct"], [100 * (1 / 1.5 - 1)] * 2, rtol=1e-9)
    with pytest.raises(ValueError, match="df = a sweep with 2 sizes .*: expected at least 3"):
        E.heldout_fit(pd.DataFrame(rows[:2]))


def test_placement_table_tp_traffic_is_per_layer_and_dp_is_the_gradient():
    t = E.placement_table(7e9, hidden=4096, layers=32, tokens=4096, group=8).set_index(
        "parallelism"
    )
    tp, pp, dp = t.iloc[0], t.iloc[1], t.iloc[2]
    assert tp["calls_per_step"] == 4 * 32 and tp["bytes_per_call"] == 4096 * 4096 * 2
    assert (
        dp["bytes_per_call"] == 14 * 10**9 and dp["overlaps_compute"] and not tp["overlaps_compute"]
    )
    # ring all-reduce over 8 at 450 GB/s and at 50 GB/s per direction
    assert tp["nvlink_s"] == pytest.approx(128 * 2 * 7 / 8 * 2**25 / 450e9, rel=1e-12)
    assert dp["infiniband_s"] == pytest.approx(0.49, rel=1e-12)
    assert pp["infiniband_s"] == pytest.approx(2 * 2**25 / 50e9, rel=1e-12)
    with pytest.raises(ValueError, match="group"):
        E.placement_table(group=1)
