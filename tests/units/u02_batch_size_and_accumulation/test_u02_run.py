"""Unit 02: roofline, memory budget, gradient accumulation, and the accumulation-bug checker."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from course_lib.measure import estimate  # noqa: E402
from course_lib.models import MLP, MLPConfig  # noqa: E402

# ----------------------------------------------------------------------- experiments
from course_lib.units.u02_batch_size_and_accumulation import run as u2  # noqa: E402


def small_mlp(seed: int = 0, width: int = 32) -> MLP:
    torch.manual_seed(seed)
    return MLP(MLPConfig(in_features=16, hidden=(width, width), out_features=5))


def test_simulated_oom_names_requested_and_available():
    budget = u2.MemoryBudget(2**20)
    budget.check(2**20, what="a step")  # exactly full fits
    with pytest.raises(u2.SimulatedOOM) as info:
        budget.check(3 * 2**20, what="a step at batch 64")
    err = info.value
    assert isinstance(err, MemoryError)
    assert (err.requested, err.available) == (3 * 2**20, 2**20)
    msg = str(err)
    assert "simulated" in msg and "a step at batch 64" in msg
    assert "3,145,728 B" in msg and "1,048,576 B" in msg and "3.00 MiB" in msg


@pytest.mark.parametrize(
    "bad, exc", [(0, ValueError), (-5, ValueError), (1.5, TypeError), (True, TypeError)]
)
def test_memory_budget_rejects_bad_capacity(bad, exc):
    with pytest.raises(exc, match="capacity_bytes"):
        u2.MemoryBudget(bad)


def test_budget_for_cpu_is_simulated():
    b = u2.MemoryBudget.for_device("cpu", simulated_bytes=123)
    assert b.simulated and b.capacity_bytes == 123 and "simulated" in b.label()


def test_op_costs_match_estimate():
    c = u2.matmul_op_cost(8, 16, 32, torch.float16)
    assert c.flops == estimate.matmul_flops(8, 16, 32) == 2 * 8 * 16 * 32
    assert c.bytes == 2 * (8 * 32 + 32 * 16 + 8 * 16)
    assert c.intensity == pytest.approx(
        estimate.matmul_arithmetic_intensity(8, 16, 32, dtype_bytes=2)
    )
    g = u2.elementwise_op_cost("gelu", 1000)
    assert g.bytes == 8000 and g.intensity == pytest.approx(1.0)
    with pytest.raises(ValueError, match=r"op must be one of \['gelu', 'layernorm'\], got 'relu'"):
        u2.elementwise_op_cost("relu", 10)


def test_roofline_runs_and_classifies_by_ridge_point():
    ops, machine = u2.roofline_ops(
        matmul_sizes=(8, 128), elementwise_numel=2**16, warmup=1, repeat=2
    )
    assert list(ops["op"].str.split().str[0]) == ["matmul", "matmul", "gelu", "layernorm"]
    assert machine["ridge_flop_per_byte"] == pytest.approx(
        machine["peak_flop_per_s"] / machine["bandwidth_bytes_per_s"]
    )
    for _, row in ops.iterrows():
        expected = "compute" if row["intensity"] >= machine["ridge_flop_per_byte"] else "memory"
        assert row["bound"] == expected
        assert row["flop_per_s"] > 0 and row["attainable_flop_per_s"] <= machine["peak_flop_per_s"]
    # elementwise ops do ~1 FLOP per byte: far below any CPU's or GPU's ridge point
    assert (ops[ops["op"].str.startswith(("gelu", "layernorm"))]["intensity"] <= 1).all()


def test_split_batch_rejects_uneven_split():
    x, y = torch.zeros(12, 3), torch.zeros(12)
    assert [a.shape[0] for a, _ in u2.split_batch(x, y, 4)] == [3, 3, 3, 3]
    with pytest.raises(
        ValueError,
        match="micro_batches = 5: expected a divisor of the batch of 12.*1, 2, 3, 4, 6, 12",
    ):
        u2.split_batch(x, y, 5)
    with pytest.raises(ValueError, match="micro_batches = 0: expected an int >= 1"):
        u2.split_batch(x, y, 0)


def test_effective_batch():
    assert u2.effective_batch(16, 4, 8) == 512
    with pytest.raises(ValueError, match="accumulation_steps = 0: expected an int >= 1"):
        u2.effective_batch(16, 0)


def test_accumulated_gradients_match_full_batch_within_rounding():
    df = u2.accumulation_vs_full_batch(small_mlp(), 24, [1, 2, 4, 8])
    one = df[df["micro_batches"] == 1]
    assert (one["max_abs_diff"] == 0).all()  # same computation, same order: bit-identical
    for _dtype, rows in df.groupby("dtype"):
        eps = rows["eps"].iloc[0]
        # summing k micro-batch gradients reorders the additions: a few eps, never more than 100
        assert (rows["rel_diff"] <= 100 * eps).all(), rows


def test_accumulation_memory_flat_and_full_batch_grows():
    df = u2.accumulation_memory_and_time(
        small_mlp(width=64), 16, [2, 4, 8], warmup=0, repeat=1, device="cpu"
    )  # exact bytes: on CUDA each storage is rounded up to 512 B
    acc = df[df["mode"] == "accumulated"]
    full = df[df["mode"] == "full batch"]
    assert acc["peak_bytes"].nunique() == 1  # flat in the number of micro-batches (exact bytes)
    assert list(acc["micro_batch"]) == [16, 16, 16]
    assert (
        full["peak_bytes"].is_monotonic_increasing
        and full["peak_bytes"].iloc[-1] > acc["peak_bytes"].iloc[-1]
    )
    # the data is the same effective batch in both modes: 16*k*16 floats + 16*k int64 targets
    assert list(acc["data_bytes"]) == [16 * k * (16 * 4 + 8) for k in (2, 4, 8)]
    assert (df["median_s"] > 0).all()


def test_throughput_vs_batch_activation_bytes_match_estimate():
    df = u2.throughput_vs_batch(small_mlp(), [4, 16], warmup=0, repeat=1, device="cpu")
    assert list(df["activation_bytes"]) == list(df["predicted_activation_bytes"])
    assert list(df["predicted_activation_bytes"]) == [
        estimate.activation_bytes_mlp(b, [16, 32, 32, 5]) for b in (4, 16)
    ]
    with pytest.raises(TypeError, match="course_lib.models.MLP"):
        u2.throughput_vs_batch(nn.Linear(3, 3), [4])


def test_largest_batch_that_fits_is_the_boundary():
    model = small_mlp(width=64)
    b8 = u2.step_peak_bytes(model, 8, optimizer="sgd")["peak_bytes"]
    b64 = u2.step_peak_bytes(model, 64, optimizer="sgd")["peak_bytes"]
    budget = u2.MemoryBudget((b8 + b64) // 2)  # simulated: tensor bytes only, on any device
    r = u2.largest_batch_that_fits(model, budget, optimizer="sgd", multiple_of=8)
    probes = r["probes"]
    assert 8 <= r["batch"] < 64 and r["peak_bytes"] <= budget.capacity_bytes
    nxt = probes[probes["batch"] == r["batch"] + 8]
    assert len(nxt) == 1 and not bool(nxt["fits"].iloc[0])  # one more step of 8 does not fit
    assert isinstance(r["oom"], u2.SimulatedOOM)
    assert r["oom"].requested == int(nxt["peak_bytes"].iloc[0])
    tiny = u2.largest_batch_that_fits(model, u2.MemoryBudget(1000), optimizer="sgd")
    assert tiny["batch"] == 0 and "batch 8" in str(tiny["oom"])


def test_peak_and_bandwidth_probes_report_their_units():
    mm = u2.measure_matmul_throughput(64, warmup=1, repeat=2)
    assert mm["flops"] == 2 * 64**3 and mm["flop_per_s"] == pytest.approx(
        mm["flops"] / mm["median_s"]
    )
    bw = u2.measure_copy_bandwidth(2**20, warmup=1, repeat=2)
    assert bw["nbytes"] == 2 * 2**20  # read + write
    with pytest.raises(ValueError, match="nbytes must be >= 4"):
        u2.measure_copy_bandwidth(2)


# ------------------------------------------------------------------ run_scale: roofline, MFU, lr
def test_roofline_step_time_counts_by_hand():
    from course_lib.models import MLP, MLPConfig
    from course_lib.units.u02_batch_size_and_accumulation import run

    model = MLP(MLPConfig(in_features=3, hidden=(5,), out_features=2))  # widths 3 -> 5 -> 2
    B = 4
    # layer 0: forward 2*4*5*3 = 120, weight grad 2*3*5*4 = 120; layer 1: forward 2*4*2*5 = 80,
    # weight grad 2*5*2*4 = 80, input grad 2*4*5*2 = 80; ReLU 2*4*5 = 40; SGD 2 x 32 params = 64
    out = run.roofline_step_time(
        model, B, peak_flops=1.0, bandwidth=1e30
    )  # compute-bound: time = FLOPs
    assert out["flops"] == 120 + 120 + 80 + 80 + 80
    assert out["predicted_s"] == pytest.approx(480 + 40 + 64)
    mem = run.roofline_step_time(
        model, B, peak_flops=1e30, bandwidth=1.0
    )  # memory-bound: time = bytes
    mm = 4 * (
        (4 * 3 + 3 * 5 + 4 * 5)
        + (3 * 4 + 4 * 5 + 3 * 5)
        + (4 * 5 + 5 * 2 + 4 * 2)
        + (5 * 4 + 4 * 2 + 5 * 2)
        + (4 * 2 + 2 * 5 + 4 * 5)
    )
    assert mem["bytes"] == mm + 2 * 2 * 4 * 4 * 5 + 12 * 32
    assert mem["predicted_s"] == pytest.approx(mem["bytes"])


def test_lr_scaling_runs_follow_the_rule():
    from course_lib.units.u02_batch_size_and_accumulation import run

    runs = [
        dict(name="small", batch=16, lr=0.05),
        dict(name="big", batch=128, lr=0.05),
        dict(name="big scaled", batch=128, lr=0.4, warmup_steps=8),
    ]
    df = run.lr_scaling_runs(runs, samples=2048, eval_every=256)
    last = df.groupby("run", sort=False).last()
    assert list(last["step"]) == [128, 16, 16]
    assert (df.groupby("run")["samples"].max() == 2048).all()
    assert last.loc["big", "eval_loss"] > last.loc["small", "eval_loss"] + 0.1
    assert abs(last.loc["big scaled", "eval_loss"] - last.loc["small", "eval_loss"]) < 0.1
    with pytest.raises(ValueError, match="batch = 0"):
        run.lr_scaling_runs([dict(name="x", batch=0, lr=0.1)], samples=64)


def test_noise_scale_matches_a_loop_over_examples():
    import torch
    import torch.nn.functional as F

    from course_lib.units.u02_batch_size_and_accumulation import run, run_scale

    got = run.simple_noise_scale_of(64)
    x, y = run.teacher_task(64)
    model = run_scale._student(x.shape[1], int(y.max()) + 1)
    grads = []
    for i in range(64):  # per-example gradients the slow way
        model.zero_grad()
        F.cross_entropy(model(x[i : i + 1]), y[i : i + 1]).backward()
        grads.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]))
    g = torch.stack(grads)
    assert got["trace_cov"] == pytest.approx(float(g.var(0).sum()), rel=1e-4)
    assert got["grad_sq_norm"] == pytest.approx(float(g.mean(0).pow(2).sum()), rel=1e-4)
    assert got["b_simple"] == pytest.approx(got["trace_cov"] / got["grad_sq_norm"])


def test_gpt_step_mfu_counts_model_flops():
    from course_lib.models import GPTConfig
    from course_lib.units.u02_batch_size_and_accumulation import run

    cfg = GPTConfig.tiny(n_layer=1, block_size=16)
    out = run.gpt_step_mfu(cfg, 2, peak_flops=1e12, device="cpu", warmup=1, repeat=2)
    n = out["params"]
    assert out["flops_per_step"] == (6 * n + 12 * 1 * 16 * 64) * 2 * 16
    assert out["mfu"] == pytest.approx(out["flops_per_step"] / out["median_s"] / 1e12)
    assert 0 < out["mfu"] < 1
