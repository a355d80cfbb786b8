"""Unit 02's graded checks: correct loops pass, each bug is named, the course's own answer is
refused, under two grading seeds; a table of the default seed's answers fails under another."""

from __future__ import annotations

import re

import pytest
from _grading_seeds import copied_fails, seed_fixture  # noqa: F401 (the seed fixture)

from course_lib.techniques import accumulation
from course_lib.units.u02_batch_size_and_accumulation import checks as grading


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
    total = sum(
        loss_fn(model(x), y) / micro_batches
        for x, y in zip(inputs.chunk(micro_batches), targets.chunk(micro_batches))
    )
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
def test_accumulation_check_passes_correct_loops(fn, capsys, seed):
    grading.check_accumulation_step(fn, task=3)
    out = capsys.readouterr().out.strip().splitlines()
    assert out == [
        "✓ task 3: 2 accumulated steps in a row equal 2 full-batch steps on 2 unseen "
        "MLPs (float64, rtol=1e-09)"
    ]


@pytest.mark.parametrize(
    "fn, pattern",
    [
        (bug_not_divided, r"loss not divided by the number of micro-batches.*\dx"),
        (bug_zero_grad_inside, r"zero_grad inside the loop"),
        (bug_grads_set_to_none_by_hand, r"zero_grad inside the loop: only the last micro-batch"),
        (
            bug_step_every_micro_batch,
            r"optimizer.step\(\) ran \d times: stepping every micro-batch",
        ),
        (bug_never_zero_grad, r"second call .*gradients never cleared"),
        (bug_one_backward_at_end, r"backward must follow each micro-batch's forward"),
        (bug_drops_last_micro_batch, r"parameter update differs from one full-batch step"),
        (stub, r"not implemented yet"),
    ],
)
def test_accumulation_check_names_each_bug(fn, pattern, seed):
    with pytest.raises(AssertionError) as info:
        grading.check_accumulation_step(fn, task=3)
    msg = str(info.value)
    assert msg.startswith("✗ task 3: "), msg
    assert re.search(pattern, msg), msg


def test_the_course_accumulation_step_rewritten_passes_and_the_original_is_refused(capsys):
    from _rewritten import rewritten

    from course_lib.techniques.accumulation import accumulation_step

    own = rewritten("course_lib.techniques.accumulation").accumulation_step  # a learner's copy
    grading.check_accumulation_step(own, task=3)
    assert capsys.readouterr().out.startswith("✓ task 3:")
    with pytest.raises(AssertionError, match="✗ task 3: uses the course's own accumulation_step"):
        grading.check_accumulation_step(accumulation_step, task=3)


def right_intensity(m, n, k, b):
    return 2 * m * n * k / (b * (m * k + k * n + m * n))


def right_plan(target, max_micro, ranks):
    if target % ranks:
        raise ValueError(f"target_batch={target} does not split over world_size={ranks}")
    per_rank = target // ranks
    micro = max(d for d in range(1, min(max_micro, per_rank) + 1) if per_rank % d == 0)
    return micro, per_rank // micro


def test_matmul_intensity_check(seed):
    from course_lib.measure import estimate

    right = right_intensity

    def half(m, n, k, b):
        return m * n * k / (b * (m * k + k * n + m * n))

    grading.check_matmul_intensity(right)
    with pytest.raises(AssertionError, match=r"✗ task 1: .*a multiply-add is 2 FLOP"):
        grading.check_matmul_intensity(half)
    with pytest.raises(AssertionError, match="not implemented yet"):
        grading.check_matmul_intensity(stub)
    # the reference really is estimate's formula
    assert right(8, 16, 32, 2) == pytest.approx(
        estimate.matmul_arithmetic_intensity(8, 16, 32, dtype_bytes=2)
    )


def test_plan_accumulation_check(capsys, seed):
    right = right_plan

    def ignores_ranks(target, max_micro, ranks):
        micro = max(d for d in range(1, min(max_micro, target) + 1) if target % d == 0)
        return micro, target // micro

    def no_error(target, max_micro, ranks):
        return right(target - target % ranks, max_micro, ranks)

    grading.check_plan_accumulation(right)
    assert capsys.readouterr().out.strip() == (
        "✓ task 2: plans match on 6 cases and an indivisible target raises ValueError"
    )
    with pytest.raises(AssertionError, match=r"x \d+ = \d+, not the target \d+"):
        grading.check_plan_accumulation(ignores_ranks)
    with pytest.raises(AssertionError, match=r"expected a ValueError"):
        grading.check_plan_accumulation(no_error)
    with pytest.raises(AssertionError, match="not implemented yet"):
        grading.check_plan_accumulation(stub)


# ------------------------------------------------------------ tasks 4-6 (predict, bug, scale)
def largest_batch(model, budget):
    w = model.config.widths
    params = 4 * sum(p.numel() for p in model.parameters())
    per = 4 * sum(w[1:-1]) + 8 * w[-2] + 4 * w[0] + 8
    return (budget - params - 4 * (w[-2] * w[-1] + w[-1])) // per


def test_largest_batch_check(capsys, seed):
    from course_lib.measure import estimate

    grading.check_largest_batch(largest_batch, task=4)
    assert capsys.readouterr().out.strip().startswith("✓ task 4: on 2 unseen MLPs your batch fits")

    def formula_only(model, budget):  # the lecture's first guess: state + activations + input
        w = model.config.widths
        params = 4 * sum(p.numel() for p in model.parameters())
        return (budget - 2 * params) // (4 * sum(w[1:]) + 4 * w[0] + 8)

    with pytest.raises(AssertionError, match=r"✗ task 4: .*does not fit: its measured peak"):
        grading.check_largest_batch(formula_only, task=4)
    with pytest.raises(AssertionError, match=r"✗ task 4: .*more than 3% too cautious"):
        grading.check_largest_batch(lambda m, b: largest_batch(m, b) // 2, task=4)
    with pytest.raises(AssertionError, match="✗ task 4: .*must be an int"):
        grading.check_largest_batch(lambda m, b: float(largest_batch(m, b)), task=4)
    with pytest.raises(
        AssertionError, match="✗ task 4: uses the course's own activation_bytes_mlp"
    ):
        grading.check_largest_batch(
            lambda m, b: (
                largest_batch(m, b) + 0 * estimate.activation_bytes_mlp(1, m.config.widths)
            ),
            task=4,
        )
    with pytest.raises(AssertionError, match="✗ task 4: not implemented yet"):
        grading.check_largest_batch(stub, task=4)


def uneven_step(model, optimizer, loss_fn, inputs, targets, micro_batches):
    optimizer.zero_grad()
    for x, y in zip(inputs.chunk(micro_batches), targets.chunk(micro_batches)):
        (loss_fn(model(x), y) * (len(x) / len(inputs))).backward()
    optimizer.step()


def uneven_buggy(model, optimizer, loss_fn, inputs, targets, micro_batches):
    optimizer.zero_grad()
    for x, y in zip(inputs.chunk(micro_batches), targets.chunk(micro_batches)):
        (loss_fn(model(x), y) / micro_batches).backward()
    optimizer.step()


def test_uneven_accumulation_check(capsys, seed):
    grading.check_uneven_accumulation("b", uneven_step, task=5)
    assert (
        capsys.readouterr()
        .out.strip()
        .startswith("✓ task 5: bug named; with a shorter last micro-batch in 2 unseen cases")
    )
    with pytest.raises(
        AssertionError, match=r"✗ task 5: .*\[[\d, ]+\] samples, yet each micro-batch's mean"
    ):
        grading.check_uneven_accumulation("b", uneven_buggy, task=5)
    with pytest.raises(AssertionError, match=r"✗ task 5: bug 'c' .*the loop is right about that"):
        grading.check_uneven_accumulation("c", uneven_step, task=5)
    with pytest.raises(AssertionError, match="✗ task 5: uses the course's own accumulation_step"):
        grading.check_uneven_accumulation("b", accumulation.accumulation_step, task=5)
    with pytest.raises(AssertionError, match="✗ task 5: not implemented yet"):
        grading.check_uneven_accumulation("b", stub, task=5)


def gpus_needed(n_params, tokens, days, peak_flops, mfu):
    import math

    return math.ceil(6 * n_params * tokens / (days * 86_400 * peak_flops * mfu))


def test_gpus_needed_check(capsys, seed):
    from course_lib.measure import estimate

    grading.check_gpus_needed(gpus_needed, task=6)
    assert capsys.readouterr().out.strip() == (
        "✓ task 6: 175B on 300B tokens in 30 days at 50 % MFU: 1,945 V100, 780 A100, 246 H100; "
        "2 drawn runs match too"
    )
    with pytest.raises(AssertionError, match=r"✗ task 6: .*round up"):
        grading.check_gpus_needed(
            lambda n, t, d, p, u: round(6 * n * t / (d * 86_400 * p * u)), task=6
        )
    with pytest.raises(AssertionError, match=r"✗ task 6: .*6 FLOPs per parameter per token"):
        grading.check_gpus_needed(lambda n, t, d, p, u: gpus_needed(n, t, d, p, u * 3), task=6)
    with pytest.raises(AssertionError, match="✗ task 6: uses the course's own gpus_for_training"):
        grading.check_gpus_needed(
            lambda n, t, d, p, u: estimate.gpus_for_training(n, t, days=d, peak_flops=p, mfu=u),
            task=6,
        )
    with pytest.raises(AssertionError, match="✗ task 6: not implemented yet"):
        grading.check_gpus_needed(stub, task=6)


def test_copied_answers_fail_under_another_seed(monkeypatch):
    copied_fails(monkeypatch, grading.check_matmul_intensity, right_intensity, task=1)
    # task 2: seed 0's plans as a table, and its indivisible target refused
    monkeypatch.setenv("COURSE_GRADE_SEED", "0")
    cases, (bad, _, _) = grading._plan_cases(2)
    table = {case: right_plan(*case) for case in cases}

    def copied_plan(target, max_micro, ranks):
        if target == bad:
            raise ValueError("copied")
        return table.get((target, max_micro, ranks), (1, target // ranks))

    grading.check_plan_accumulation(copied_plan, task=2)
    monkeypatch.setenv("COURSE_GRADE_SEED", "7")
    with pytest.raises(AssertionError, match="✗ task 2: "):
        grading.check_plan_accumulation(copied_plan, task=2)
    copied_fails(monkeypatch, grading.check_largest_batch, largest_batch, task=4)
    copied_fails(monkeypatch, grading.check_gpus_needed, gpus_needed, task=6)


def test_lecture_constants_fail(seed):
    """The lecture's worked example (175B on 300B tokens) as constants: the drawn runs fail."""
    printed = {175 * 10**9: 780}
    with pytest.raises(AssertionError, match="✗ task 6: "):
        grading.check_gpus_needed(lambda n, t, d, p, u: printed.get(n, 8), task=6)


@pytest.mark.parametrize(
    "name, task",
    [
        ("check_matmul_intensity", 1),
        ("check_plan_accumulation", 2),
        ("check_accumulation_step", 3),
        ("check_largest_batch", 4),
        ("check_uneven_accumulation", 5),
        ("check_gpus_needed", 6),
    ],
)
def test_the_judge_trusts_nothing_it_is_handed(name, task):
    """Whatever plain data comes back from the learner's side, a malformed one is a ✗ line."""
    import torch

    check = getattr(grading, name)
    case = {"events": [[], []], "params": [torch.zeros(3), torch.zeros(3)], "left_over": None}
    forged = [None, 7, "✓", [], [None] * 6, {}, {"plans": [], "indivisible": {}}, [case, case]]
    forged += [{"bug": "b", "cases": [case, case]}, {"bug": "b", "cases": None}, [10**12] * 2]
    for data in forged:
        with pytest.raises(AssertionError, match=f"✗ task {task}: "):
            check.run_judge(data)


def test_a_batch_whose_input_alone_is_over_the_budget_is_not_measured():
    with pytest.raises(AssertionError, match=r"✗ task 4: .*input batch and labels alone take"):
        grading.check_largest_batch(lambda model, budget: budget, task=4)
