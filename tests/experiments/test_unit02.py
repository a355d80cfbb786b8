"""Unit 02: roofline, memory budget, gradient accumulation, and the accumulation-bug checker."""
from __future__ import annotations

import re

import pytest
import torch
from torch import nn

from course_lib.grading import unit02 as grading


# ----------------------------------------------------------------------- learner variants
def correct(model, optimizer, loss_fn, inputs, targets, micro_batches):
    optimizer.zero_grad()
    for x, y in zip(inputs.chunk(micro_batches), targets.chunk(micro_batches)):
        (loss_fn(model(x), y) / micro_batches).backward()
    optimizer.step()


def correct_zero_grad_after(model, optimizer, loss_fn, inputs, targets, micro_batches):
    for x, y in zip(inputs.chunk(micro_batches), targets.chunk(micro_batches)):
        loss = loss_fn(model(x), y)
        (loss / micro_batches).backward()
    optimizer.step()
    model.zero_grad()


def bug_not_divided(model, optimizer, loss_fn, inputs, targets, micro_batches):
    optimizer.zero_grad()
    for x, y in zip(inputs.chunk(micro_batches), targets.chunk(micro_batches)):
        loss_fn(model(x), y).backward()
    optimizer.step()


def bug_zero_grad_inside(model, optimizer, loss_fn, inputs, targets, micro_batches):
    for x, y in zip(inputs.chunk(micro_batches), targets.chunk(micro_batches)):
        optimizer.zero_grad()
        (loss_fn(model(x), y) / micro_batches).backward()
    optimizer.step()


def bug_grads_set_to_none_by_hand(model, optimizer, loss_fn, inputs, targets, micro_batches):
    for x, y in zip(inputs.chunk(micro_batches), targets.chunk(micro_batches)):
        for p in model.parameters():
            p.grad = None  # the same bug without calling zero_grad
        (loss_fn(model(x), y) / micro_batches).backward()
    optimizer.step()


def bug_never_zero_grad(model, optimizer, loss_fn, inputs, targets, micro_batches):
    # right on a fresh model; on the next call the old gradients are added to the new ones
    for x, y in zip(inputs.chunk(micro_batches), targets.chunk(micro_batches)):
        (loss_fn(model(x), y) / micro_batches).backward()
    optimizer.step()


def bug_step_every_micro_batch(model, optimizer, loss_fn, inputs, targets, micro_batches):
    optimizer.zero_grad()
    for x, y in zip(inputs.chunk(micro_batches), targets.chunk(micro_batches)):
        (loss_fn(model(x), y) / micro_batches).backward()
        optimizer.step()


def bug_one_backward_at_end(model, optimizer, loss_fn, inputs, targets, micro_batches):
    optimizer.zero_grad()
    total = sum(loss_fn(model(x), y) / micro_batches
                for x, y in zip(inputs.chunk(micro_batches), targets.chunk(micro_batches)))
    total.backward()
    optimizer.step()


def bug_drops_last_micro_batch(model, optimizer, loss_fn, inputs, targets, micro_batches):
    optimizer.zero_grad()
    chunks = list(zip(inputs.chunk(micro_batches), targets.chunk(micro_batches)))
    for x, y in chunks[:-1] + chunks[:1]:  # right count, wrong data
        (loss_fn(model(x), y) / micro_batches).backward()
    optimizer.step()


def stub(*args):
    raise NotImplementedError("FILL ME IN (roughly 6 lines)")


@pytest.mark.parametrize("fn", [correct, correct_zero_grad_after])
def test_accumulation_check_passes_correct_loops(fn, capsys):
    grading.check_accumulation_step(fn, task=3)
    out = capsys.readouterr().out.strip().splitlines()
    assert out == ["✓ task 3: 2 accumulated steps in a row equal 2 full-batch steps on 2 unseen "
                   "MLPs (float64, rtol=1e-09)"]


@pytest.mark.parametrize("fn, pattern", [
    (bug_not_divided, r"loss not divided by the number of micro-batches.*3x"),
    (bug_zero_grad_inside, r"zero_grad inside the loop"),
    (bug_grads_set_to_none_by_hand, r"zero_grad inside the loop: only the last micro-batch"),
    (bug_step_every_micro_batch, r"optimizer.step\(\) ran 3 times: stepping every micro-batch"),
    (bug_never_zero_grad, r"second call .*gradients never cleared"),
    (bug_one_backward_at_end, r"backward must follow each micro-batch's forward"),
    (bug_drops_last_micro_batch, r"parameter update differs from one full-batch step"),
    (stub, r"not implemented yet"),
])
def test_accumulation_check_names_each_bug(fn, pattern):
    with pytest.raises(AssertionError) as info:
        grading.check_accumulation_step(fn, task=3)
    msg = str(info.value)
    assert msg.startswith("✗ task 3: "), msg
    assert re.search(pattern, msg), msg


def test_library_accumulation_step_passes_the_checker(capsys):
    from course_lib.experiments.unit02_batch import accumulation_step

    grading.check_accumulation_step(accumulation_step, task=3)
    assert capsys.readouterr().out.startswith("✓ task 3:")


def test_matmul_intensity_check():
    from course_lib.measure import estimate

    def right(m, n, k, b):
        return 2 * m * n * k / (b * (m * k + k * n + m * n))

    def half(m, n, k, b):
        return m * n * k / (b * (m * k + k * n + m * n))

    grading.check_matmul_intensity(right)
    with pytest.raises(AssertionError, match=r"✗ task 1: .*a multiply-add is 2 FLOP"):
        grading.check_matmul_intensity(half)
    with pytest.raises(AssertionError, match="not implemented yet"):
        grading.check_matmul_intensity(stub)
    # the reference really is estimate's formula
    assert right(8, 16, 32, 2) == pytest.approx(estimate.matmul_arithmetic_intensity(8, 16, 32, dtype_bytes=2))


def test_plan_accumulation_check(capsys):
    def right(target, max_micro, ranks):
        if target % ranks:
            raise ValueError(f"target_batch={target} does not split over world_size={ranks}")
        per_rank = target // ranks
        micro = max(d for d in range(1, min(max_micro, per_rank) + 1) if per_rank % d == 0)
        return micro, per_rank // micro

    def ignores_ranks(target, max_micro, ranks):
        micro = max(d for d in range(1, min(max_micro, target) + 1) if target % d == 0)
        return micro, target // micro

    def no_error(target, max_micro, ranks):
        return right(target - target % ranks, max_micro, ranks)

    grading.check_plan_accumulation(right)
    assert capsys.readouterr().out.startswith("✓ task 2:")
    with pytest.raises(AssertionError, match=r"x 4 = 2048, not the target 512"):
        grading.check_plan_accumulation(ignores_ranks)
    with pytest.raises(AssertionError, match=r"expected a ValueError"):
        grading.check_plan_accumulation(no_error)
    with pytest.raises(AssertionError, match="not implemented yet"):
        grading.check_plan_accumulation(stub)


# ----------------------------------------------------------------------- experiments
from course_lib.experiments import unit02_batch as u2  # noqa: E402
from course_lib.measure import estimate  # noqa: E402
from course_lib.models import MLP, MLPConfig  # noqa: E402


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


@pytest.mark.parametrize("bad, exc", [(0, ValueError), (-5, ValueError), (1.5, TypeError),
                                      (True, TypeError)])
def test_memory_budget_rejects_bad_capacity(bad, exc):
    with pytest.raises(exc, match="capacity_bytes"):
        u2.MemoryBudget(bad)


def test_budget_for_cpu_is_simulated():
    b = u2.MemoryBudget.for_device("cpu", simulated_bytes=123)
    assert b.simulated and b.capacity_bytes == 123 and "simulated" in b.label()


def test_op_costs_match_estimate():
    c = u2.matmul_cost(8, 16, 32, torch.float16)
    assert c.flops == estimate.matmul_flops(8, 16, 32) == 2 * 8 * 16 * 32
    assert c.bytes == 2 * (8 * 32 + 32 * 16 + 8 * 16)
    assert c.intensity == pytest.approx(estimate.matmul_arithmetic_intensity(8, 16, 32, dtype_bytes=2))
    g = u2.elementwise_cost("gelu", 1000)
    assert g.bytes == 8000 and g.intensity == pytest.approx(1.0)
    with pytest.raises(ValueError, match=r"op must be one of \['gelu', 'layernorm'\], got 'relu'"):
        u2.elementwise_cost("relu", 10)


def test_roofline_runs_and_classifies_by_ridge_point():
    ops, machine = u2.roofline_ops(matmul_sizes=(8, 128), elementwise_numel=2**16, warmup=1,
                                   repeat=2)
    assert list(ops["op"].str.split().str[0]) == ["matmul", "matmul", "gelu", "layernorm"]
    assert machine["ridge_flop_per_byte"] == pytest.approx(
        machine["peak_flop_per_s"] / machine["bandwidth_bytes_per_s"])
    for _, row in ops.iterrows():
        expected = "compute" if row["intensity"] >= machine["ridge_flop_per_byte"] else "memory"
        assert row["bound"] == expected
        assert row["flop_per_s"] > 0 and row["attainable_flop_per_s"] <= machine["peak_flop_per_s"]
    # elementwise ops do ~1 FLOP per byte: far below any CPU's or GPU's ridge point
    assert (ops[ops["op"].str.startswith(("gelu", "layernorm"))]["intensity"] <= 1).all()


def test_split_batch_rejects_uneven_split():
    x, y = torch.zeros(12, 3), torch.zeros(12)
    assert [a.shape[0] for a, _ in u2.split_batch(x, y, 4)] == [3, 3, 3, 3]
    with pytest.raises(ValueError, match=r"micro_batches=5 does not divide the batch of 12.*\[1, 2, 3, 4, 6, 12\]"):
        u2.split_batch(x, y, 5)
    with pytest.raises(ValueError, match="micro_batches must be a positive int"):
        u2.split_batch(x, y, 0)


def test_effective_batch():
    assert u2.effective_batch(16, 4, 8) == 512
    with pytest.raises(ValueError, match="accumulation_steps must be a positive int"):
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
    df = u2.accumulation_memory_and_time(small_mlp(width=64), 16, [2, 4, 8], warmup=0, repeat=1)
    acc = df[df["mode"] == "accumulated"]
    full = df[df["mode"] == "full batch"]
    assert acc["peak_bytes"].nunique() == 1  # flat in the number of micro-batches (exact bytes)
    assert list(acc["micro_batch"]) == [16, 16, 16]
    assert full["peak_bytes"].is_monotonic_increasing and full["peak_bytes"].iloc[-1] > acc["peak_bytes"].iloc[-1]
    # the data is the same effective batch in both modes: 16*k*16 floats + 16*k int64 targets
    assert list(acc["data_bytes"]) == [16 * k * (16 * 4 + 8) for k in (2, 4, 8)]
    assert (df["median_s"] > 0).all()


def test_throughput_vs_batch_activation_bytes_match_estimate():
    df = u2.throughput_vs_batch(small_mlp(), [4, 16], warmup=0, repeat=1)
    assert list(df["activation_bytes"]) == list(df["predicted_activation_bytes"])
    assert list(df["predicted_activation_bytes"]) == [
        estimate.activation_bytes_mlp(b, [16, 32, 32, 5]) for b in (4, 16)]
    with pytest.raises(TypeError, match="course_lib.models.MLP"):
        u2.throughput_vs_batch(nn.Linear(3, 3), [4])


def test_largest_batch_that_fits_is_the_boundary():
    model = small_mlp(width=64)
    b8 = u2.step_peak_bytes(model, 8, optimizer="sgd")["peak_bytes"]
    b64 = u2.step_peak_bytes(model, 64, optimizer="sgd")["peak_bytes"]
    budget = u2.MemoryBudget((b8 + b64) // 2)
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
    assert mm["flops"] == 2 * 64**3 and mm["flop_per_s"] == pytest.approx(mm["flops"] / mm["median_s"])
    bw = u2.measure_copy_bandwidth(2**20, warmup=1, repeat=2)
    assert bw["nbytes"] == 2 * 2**20  # read + write
    with pytest.raises(ValueError, match="nbytes must be >= 4"):
        u2.measure_copy_bandwidth(2)
