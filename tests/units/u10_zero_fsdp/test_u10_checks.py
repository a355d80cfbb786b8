"""Unit 10's graded checks: a correct answer passes, a wrong one fails with a ✗ line, one that
calls the course's own answer is refused."""

from __future__ import annotations

import re

import pytest
import torch
from _grading_seeds import FIXTURE_SEEDS  # seed 0: tests/_grading_seeds.py

from course_lib.units.u10_zero_fsdp import _cases as K
from course_lib.units.u10_zero_fsdp import checks as C

SEEDS = ("0", "7")  # the default seed (the notebooks) and another grading's


@pytest.fixture(params=FIXTURE_SEEDS)
def seed(request, monkeypatch):
    monkeypatch.setenv("COURSE_GRADE_SEED", request.param)
    return request.param


# ---- task 1 --------------------------------------------------------------------------------
def good_step(flat_param, flat_grad, shard, optimizer):
    import torch.distributed as dist

    world = dist.get_world_size()
    grad = torch.empty_like(shard.detach())
    dist.reduce_scatter_single(grad, flat_grad)
    shard.grad = grad / world
    optimizer.step()
    dist.all_gather_single(flat_param, shard.detach().clone())


def no_gather_step(flat_param, flat_grad, shard, optimizer):  # the bug: no all-gather
    import torch.distributed as dist

    grad = torch.empty_like(shard.detach())
    dist.reduce_scatter_single(grad, flat_grad)
    shard.grad = grad / dist.get_world_size()
    optimizer.step()


def undivided_step(flat_param, flat_grad, shard, optimizer):  # the sum, not the mean
    import torch.distributed as dist

    grad = torch.empty_like(shard.detach())
    dist.reduce_scatter_single(grad, flat_grad)
    shard.grad = grad
    optimizer.step()
    dist.all_gather_single(flat_param, shard.detach().clone())


def course_step(flat_param, flat_grad, shard, optimizer):
    from torch import nn

    from course_lib.parallel.zero import ZeroDataParallel

    ZeroDataParallel(nn.Linear(2, 2).double(), stage=1)
    good_step(flat_param, flat_grad, shard, optimizer)


@pytest.mark.slow
def test_check_zero1_step(seed):
    C.check_zero1_step(good_step)
    width = K.training_case(1, 3)["width"]
    with pytest.raises(
        AssertionError,
        match=rf"✗ task 1: on 3 ranks \(MLP of width {width}\), step 1, rank 0: param "
        r".*at step 1 on rank 0 after your step rank 0's flat_param differs from rank 1's",
    ) as err:
        C.check_zero1_step(no_gather_step)
    assert "all-gather" not in str(err.value)  # what the check saw, not the fix
    with pytest.raises(AssertionError, match=r"shard.grad is 3 x the mean over ranks") as err:
        C.check_zero1_step(undivided_step)
    assert "all-gather" not in str(err.value)
    with pytest.raises(AssertionError, match="✗ task 1: uses the course's own ZeroDataParallel"):
        C.check_zero1_step(course_step)


def test_the_drawn_models_always_pad_and_differ_between_seeds(monkeypatch):
    cases = []
    for s in SEEDS:
        monkeypatch.setenv("COURSE_GRADE_SEED", s)
        cases.append((K.training_case(1, 3), K.training_case(3, 2), K.memory_case(2, 3)))
        assert K.mlp_params(cases[-1][0]["width"]) % 3 and K.mlp_params(cases[-1][1]["width"]) % 2
        assert cases[-1][2]["width"] != 250  # not the lecture's model
    assert cases[0] != cases[1]


# ---- task 2 --------------------------------------------------------------------------------
def good_prediction(units, stage, world_size):
    psi = sum(map(sum, units))
    shards = sum(-(-sum(u) // world_size) for u in units)
    if stage == 0:
        return {
            "params": 4 * psi,
            "grads": 4 * psi,
            "optimizer": 8 * psi + 4 * sum(len(u) for u in units),
        }
    return {
        "params": 4 * (shards if stage == 3 else world_size * shards),
        "grads": 4 * (shards if stage >= 2 else psi),
        "optimizer": 8 * shards + 4 * len(units),
    }


def unpadded_prediction(units, stage, world_size):  # the paper's Psi / N: misses the padding
    psi = sum(map(sum, units))
    out = good_prediction(units, stage, world_size)
    if stage:
        out["optimizer"] = 8 * psi // world_size + 4 * len(units)
    return out


def course_prediction(units, stage, world_size):
    from course_lib.measure import estimate

    bd = estimate.zero_layout_bytes_per_rank(units, stage=stage, world_size=world_size)
    return {k: bd[k] for k in ("params", "grads", "optimizer")}


def test_check_memory_prediction(seed):
    C.check_memory_prediction(good_prediction)
    with pytest.raises(
        AssertionError, match=r"✗ task 2: units .*, stage 1, 3 ranks: you predicted .* of optimizer"
    ) as err:
        C.check_memory_prediction(unpadded_prediction)
    assert "MemoryMeter finds more in rank" in str(err.value)
    with pytest.raises(
        AssertionError, match="✗ task 2: uses the course's own zero_layout_bytes_per_rank"
    ):
        C.check_memory_prediction(course_prediction)
    with pytest.raises(AssertionError, match="✗ task 2: stage 0 params must be an int"):
        C.check_memory_prediction(
            lambda u, s, n: {k: float(v) for k, v in good_prediction(u, s, n).items()}
        )


def test_a_copied_memory_prediction_fails_under_another_seed(monkeypatch):
    from course_lib.units.u10_zero_fsdp._check_parts import _memory_model_of
    from course_lib.units.u10_zero_fsdp.run import units_of

    units = units_of(_memory_model_of(K.memory_case(2, 3)["width"]))  # seed 0's model
    table = {stage: good_prediction(units, stage, 3) for stage in range(4)}
    C.check_memory_prediction(lambda u, stage, n: table[stage])
    monkeypatch.setenv("COURSE_GRADE_SEED", "7")
    with pytest.raises(AssertionError, match="✗ task 2: units .*: you predicted"):
        C.check_memory_prediction(lambda u, stage, n: table[stage])


# ---- task 3 --------------------------------------------------------------------------------
def _hook(params, shard, *, free):
    import torch.distributed as dist

    world = dist.get_world_size()
    flat = torch.zeros(world * shard.numel(), dtype=shard.dtype)
    offset = 0
    for p in params:
        flat[offset : offset + p.numel()] = p.grad.reshape(-1)
        offset += p.numel()
        if free:
            p.grad = None
    g = torch.empty_like(shard.detach())
    dist.reduce_scatter_single(g, flat)
    g /= world
    shard.grad = g if shard.grad is None else shard.grad + g


def good_hook(params, shard):
    _hook(params, shard, free=True)


def keeping_hook(params, shard):  # the exercise's bug: right numbers, stage-1 memory
    _hook(params, shard, free=False)


def course_hook(params, shard):
    from torch import nn

    from course_lib.parallel.zero import ZeroDataParallel

    ZeroDataParallel(nn.Linear(2, 2).double(), stage=2)  # every rank, same order: a collective
    _hook(params, shard, free=True)


@pytest.mark.slow
def test_check_stage2_hook(seed):
    C.check_stage2_hook(good_hook)
    with pytest.raises(AssertionError, match="✗ task 3: rank 0: after backward MemoryMeter finds"):
        C.check_stage2_hook(keeping_hook)
    with pytest.raises(AssertionError, match="✗ task 3: uses the course's own ZeroDataParallel"):
        C.check_stage2_hook(course_hook)


# ---- task 4 --------------------------------------------------------------------------------
def good_stage(n_params, world_size, gpu_GB):
    for stage in range(4):
        p = 2 * n_params / (world_size if stage == 3 else 1)
        g = 2 * n_params / (world_size if stage >= 2 else 1)
        o = 12 * n_params / (world_size if stage >= 1 else 1)
        if p + g + o <= gpu_GB * 1e9:
            return stage
    return None


def naive_stage(n_params, world_size, gpu_GB):  # divides everything by N at every stage
    for stage in range(4):
        if 16 * n_params / (world_size if stage else 1) <= gpu_GB * 1e9:
            return stage
    return None


def course_stage(n_params, world_size, gpu_GB):
    from course_lib.units.u10_zero_fsdp.run import smallest_stage

    return smallest_stage(n_params, world_size, gpu_GB)


def test_check_smallest_stage(seed, capsys):
    C.check_smallest_stage(good_stage)
    assert capsys.readouterr().out == (
        "✓ task 4: smallest stage right in 9 drawn plans: every stage, None, one GPU, exact fits\n"
    )
    with pytest.raises(
        AssertionError, match=r"✗ task 4: .*B parameters on \d+ GPUs? of \d+ GB"
    ) as seen:
        C.check_smallest_stage(naive_stage)
    # the hint names the plan and what the answer's stage holds, never the right stage (issue 26)
    found = re.search(
        r"([\d.]+)B parameters on (\d+) GPUs? of (\d+) GB: you returned (\w+)", str(seen.value)
    )
    assert found, seen.value
    right = good_stage(float(found[1]) * 1e9, int(found[2]), int(found[3]))
    assert str(right) != found[4] and f"stage {right} " not in str(seen.value).split("returned")[1]
    assert "expected" not in str(seen.value)
    with pytest.raises(AssertionError, match="✗ task 4: uses the course's own smallest_stage"):
        C.check_smallest_stage(course_stage)
    with pytest.raises(AssertionError, match="must be an int"):
        C.check_smallest_stage(lambda n, w, g: float(good_stage(n, w, g) or 0))
    with pytest.raises(AssertionError, match=r"you returned \d; stage \d holds"):  # < for <=
        C.check_smallest_stage(lambda n, w, g: good_stage(n, w, g - 1e-9))


def test_the_plans_cover_every_answer_and_an_exact_fit(seed):
    cases = K.plan_cases(4)
    answers = [K.lowest_stage(n, w, g) for n, w, g in cases]
    assert set(answers) == {0, 1, 2, 3, None}
    assert {w for n, w, g in cases if w == 1} == {1}
    assert any(K._state(n, w, s) == g * 10**9 for n, w, g in cases for s in range(4))


def test_a_copied_table_or_the_lecture_fails_under_another_seed(monkeypatch):
    table = {case: good_stage(*case) for case in K.plan_cases(4)}  # seed 0's plans and answers
    lecture = {(7e9, 8, 80): 1, (7e9, 64, 80): 1, (70e9, 8, 80): None, (70e9, 64, 80): 3}

    def copied(n, w, g):
        return table.get((n, w, g), next(iter(table.values())))

    C.check_smallest_stage(copied)
    monkeypatch.setenv("COURSE_GRADE_SEED", "7")
    with pytest.raises(AssertionError, match="✗ task 4: .*: you returned"):
        C.check_smallest_stage(copied)
    for s in ("0", "7"):
        monkeypatch.setenv("COURSE_GRADE_SEED", s)
        with pytest.raises(AssertionError, match="✗ task 4: .*: you returned"):
            C.check_smallest_stage(lambda n, w, g: lecture.get((n, w, g), 1))
