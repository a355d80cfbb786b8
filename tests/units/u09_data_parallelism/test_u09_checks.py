"""Unit 09's graded checks: a correct answer passes, a wrong one fails with a ✗ line, one that
calls the course's own answer is refused."""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F
from _grading_seeds import FIXTURE_SEEDS  # seed 0: tests/_grading_seeds.py

from course_lib.units.u09_data_parallelism import checks as C


def good_hook(model, buckets):
    import torch.distributed as dist

    world = dist.get_world_size()
    params = dict(model.named_parameters())
    state = {"arrived": [0] * len(buckets), "next": 0, "pending": []}

    def launch_ready():
        while state["next"] < len(buckets) and state["arrived"][state["next"]] == len(
            buckets[state["next"]]
        ):
            names = buckets[state["next"]]
            flat = torch.cat([params[n].grad.reshape(-1) for n in names]) / world
            state["pending"].append((names, flat, dist.all_reduce(flat, async_op=True)))
            state["next"] += 1

    for i, names in enumerate(buckets):
        for n in names:

            def hook(p, i=i):
                state["arrived"][i] += 1
                launch_ready()

            params[n].register_post_accumulate_grad_hook(hook)

    def finish():
        for names, flat, work in state["pending"]:
            work.wait()
            for n, g in zip(names, flat.split([params[n].numel() for n in names])):
                params[n].grad.copy_(g.view_as(params[n]))
        state.update(arrived=[0] * len(buckets), next=0, pending=[])

    return finish


def blocking_hook(model, buckets):
    """All-reduces every gradient after backward: right numbers, no overlap."""
    import torch.distributed as dist

    def finish():
        for p in model.parameters():
            p.grad /= dist.get_world_size()
            dist.all_reduce(p.grad)

    return finish


def course_hook(model, buckets):
    from course_lib.parallel.ddp import DataParallel

    DataParallel(model, bucket_cap_mb=C.HOOK_CAP_MB)
    return lambda: None


@pytest.mark.slow
@pytest.mark.parametrize("seed", FIXTURE_SEEDS)
def test_check_bucketed_hook(seed, monkeypatch):
    monkeypatch.setenv("COURSE_GRADE_SEED", seed)
    C.check_bucketed_hook(good_hook)
    with pytest.raises(AssertionError, match="✗ task 1: .*expected 4 all_reduce calls during"):
        C.check_bucketed_hook(blocking_hook)
    with pytest.raises(AssertionError, match="✗ task 1: uses the course's own DataParallel"):
        C.check_bucketed_hook(course_hook)


def good_loop(model, micro_batches):
    k = len(micro_batches)
    for i, (x, y) in enumerate(micro_batches):
        with model.no_sync() if i < k - 1 else contextlib.nullcontext():
            (F.mse_loss(model(x), y) / k).backward()


def buggy_loop(model, micro_batches):  # the exercise's bug: the condition is inverted
    k = len(micro_batches)
    for i, (x, y) in enumerate(micro_batches):
        with model.no_sync() if i == k - 1 else contextlib.nullcontext():
            (F.mse_loss(model(x), y) / k).backward()


@pytest.mark.parametrize("seed", FIXTURE_SEEDS)
def test_check_no_sync_loop(seed, monkeypatch, capsys):
    monkeypatch.setenv("COURSE_GRADE_SEED", seed)
    C.check_no_sync_loop(good_loop)
    assert capsys.readouterr().out.startswith("✓ task 2:")
    with pytest.raises(AssertionError, match="✗ task 2: rank 0: 12 all-reduce calls"):
        C.check_no_sync_loop(buggy_loop)


def good_steps(b, m, n):
    if b % (m * n):
        raise ValueError("no whole number of steps")
    return b // (m * n)


@pytest.mark.parametrize("seed", FIXTURE_SEEDS)
def test_check_accumulation_steps(seed, monkeypatch, capsys):
    monkeypatch.setenv("COURSE_GRADE_SEED", seed)
    good = good_steps
    C.check_accumulation_steps(good)
    assert capsys.readouterr().out.startswith("✓ task 3: accumulation steps right in 6 configs")
    with pytest.raises(AssertionError, match="expected an int"):
        C.check_accumulation_steps(lambda b, m, n: good(b, m, n) / 1)
    with pytest.raises(AssertionError, match="no whole number of steps fits: raise ValueError"):
        C.check_accumulation_steps(lambda b, m, n: b // (m * n))
    with pytest.raises(
        AssertionError, match=r"you returned \d+ accumulation steps: .* rows per step"
    ):
        C.check_accumulation_steps(lambda b, m, n: good(b, m, 2))  # the sources' 2 GPUs
    from course_lib.units.u09_data_parallelism.run import accumulation_steps_for

    with pytest.raises(AssertionError, match="uses the course's own accumulation_steps_for"):
        C.check_accumulation_steps(lambda b, m, n: accumulation_steps_for(b, m, n))


def test_the_batch_cases_keep_their_edge_cases_and_a_copied_table_fails(monkeypatch):
    cases = C.batch_cases(3)
    answers = [steps for *_, steps in cases]
    assert answers.count(None) == 2 and 1 in answers and any(n == 1 for _, _, n, _ in cases)
    table = {(b, m, n): steps for b, m, n, steps in cases}  # seed 0's, built here

    def copied(b, m, n):
        if table.get((b, m, n), 1) is None:
            raise ValueError("copied")
        return table.get((b, m, n), 4)

    C.check_accumulation_steps(copied)
    monkeypatch.setenv("COURSE_GRADE_SEED", "7")
    assert C.batch_cases(3) != cases
    with pytest.raises(AssertionError, match="✗ task 3: train "):
        C.check_accumulation_steps(copied)


@pytest.mark.slow
@pytest.mark.parametrize("seed", FIXTURE_SEEDS)
def test_check_bytes_prediction(seed, monkeypatch, capsys):
    monkeypatch.setenv("COURSE_GRADE_SEED", seed)
    C.check_bytes_prediction(lambda p, b, n, k: 2 * (n - 1) * p * b // n)
    assert capsys.readouterr().out.startswith("✓ task 4:")
    with pytest.raises(AssertionError, match="✗ task 4: .*you predicted"):
        C.check_bytes_prediction(lambda p, b, n, k: k * 2 * (n - 1) * p * b // n)  # no no_sync
    with pytest.raises(AssertionError, match="expected an int"):
        C.check_bytes_prediction(lambda p, b, n, k: 2 * (n - 1) * p * b / n)
    from course_lib.measure import estimate

    with pytest.raises(AssertionError, match="uses the course's own ring_allreduce_bytes_sent"):
        C.check_bytes_prediction(
            lambda p, b, n, k: int(estimate.ring_allreduce_bytes_sent(p * b, n))
        )


@pytest.mark.slow
def test_copied_bytes_fail_under_another_seed(monkeypatch):
    from course_lib.grading.seeds import case_rng
    from course_lib.units.u09_data_parallelism.run import model_fn

    width = case_rng(4, C.UNIT).choice(C.BYTE_WIDTHS)  # seed 0's model, its bytes built here
    p0 = sum(p.numel() for p in model_fn(width=width).parameters())

    def copied(p, b, n, k):
        return 2 * (n - 1) * p0 * b // n

    C.check_bytes_prediction(copied)
    monkeypatch.setenv("COURSE_GRADE_SEED", "7")
    assert case_rng(4, C.UNIT).choice(C.BYTE_WIDTHS) != width
    with pytest.raises(AssertionError, match="✗ task 4: .*you predicted"):
        C.check_bytes_prediction(copied)


def test_judges_refuse_malformed_data():
    # the judge half trusts nothing the learner's side hands back: a ✗, never a ✓ or a crash
    # (none of these reaches task 4's own measurement on ranks)
    record = {"losses": [0.0, 0.0], "grads": [{}, {}], "params": [{}, {}, {}]}
    steps = [{"during": [], "finish": []}] * 2
    junk = [None, {}, [], "✓", 3, {"runs": None}, {"runs": [[{}] * 2, [{}] * 3]}]
    junk += [{"runs": [[{"steps": steps, "record": record}] * 2, [{}] * 3]}]
    junk += [{"runs": [[{"calls": [], "grads": {"x": torch.zeros(1)}}] * 2]}]
    junk += [{"runs": [[{"calls": [{"op": "all_reduce"}], "grads": {}}] * 2]}]
    junk += [[{"returned": 1}] * 6, [{"raised": 5}] * 6, [{"returned": 1, "raised": ""}] * 6]
    junk += [[1.0, 2.0], [None] * 4]
    checks = [
        C.check_bucketed_hook,
        C.check_no_sync_loop,
        C.check_accumulation_steps,
        C.check_bytes_prediction,
    ]
    for check in checks:
        for data in junk:
            with pytest.raises(AssertionError, match=rf"✗ task {check.task}: "):
                check.run_judge(data)
