"""Unit 08's graded checks accept the reference and reject wrong answers."""

from __future__ import annotations

import re

import pytest
import torch
import torch.distributed as dist
from _grading_seeds import copied_fails, seed_fixture  # noqa: F401 (the seed fixture)
from _rewritten import rewritten

from course_lib.measure import estimate
from course_lib.parallel import collectives as course_C  # the course's own, which checks refuse

# the course's rings as a learner would have written them: same code, compiled anew (the checks
# refuse the course's own functions)
C = rewritten("course_lib.parallel.collectives.ring")

NUMELS = (1, 7, 1001)
DTYPES = (torch.float32, torch.float64)


# --------------------------------------------------------------------------------------------
# the graded checks of unit 08 accept the reference and reject wrong answers
# --------------------------------------------------------------------------------------------
def _stub_all_reduce(tensor):
    raise NotImplementedError("FILL ME IN (roughly 20 lines)")


def _library_all_reduce(tensor):
    dist.all_reduce(tensor)  # right values, but not built from send/recv
    return tensor


def _half_gather(output, input):
    C.ring_all_gather(output, input)
    if dist.get_rank() == 1:
        output.zero_()  # wrong on one rank only


@pytest.mark.slow
def test_checks_pass_for_the_reference_implementations(capsys):
    from course_lib.units.u08_collectives import checks as unit08

    unit08.check_ring_all_reduce(C.ring_all_reduce)
    unit08.check_ring_all_gather(C.ring_all_gather, task=2)
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("✓ task 1: ring all-reduce matches dist.all_reduce")
    assert lines[1].startswith("✓ task 2: ring all-gather equals")


def test_checks_reject_stub_library_call_naive_ring_and_wrong_rank():
    from course_lib.units.u08_collectives import checks as unit08

    with pytest.raises(AssertionError, match="✗ task 1: not implemented yet"):
        unit08.check_ring_all_reduce(_stub_all_reduce)
    with pytest.raises(AssertionError, match="only point-to-point"):
        unit08.check_ring_all_reduce(_library_all_reduce)
    with pytest.raises(AssertionError, match=r"2\(N-1\)/N \* S"):
        unit08.check_ring_all_reduce(C.naive_ring_all_reduce)  # right sums, (N-1) S bytes
    with pytest.raises(AssertionError, match="differs from torch.distributed on rank 1"):
        unit08.check_ring_all_gather(_half_gather, task=2)


def test_composite_bytes_check(seed):
    from course_lib.units.u08_collectives import checks as unit08

    unit08.check_composite_bytes(lambda s, n: 2 * (n - 1) * s / n)
    with pytest.raises(AssertionError, match="✗ task 3: for S"):
        unit08.check_composite_bytes(lambda s, n: 2 * s)
    with pytest.raises(AssertionError, match="not implemented yet"):
        unit08.check_composite_bytes(lambda s, n: _stub_all_reduce(s))


# --------------------------------------------------------------------------------------------
# tasks 4-6: predict before you measure, find the bug, scale it up
# --------------------------------------------------------------------------------------------
def _wait(sleeps):
    return [max(sleeps) - s for s in sleeps]  # an all-reduce ends when its last rank arrives


@pytest.mark.slow
def test_straggler_prediction_passes_measured_and_fails_wrong(capsys, monkeypatch):
    from course_lib.units.u08_collectives import checks as unit08

    unit08.check_straggler_prediction(_wait)  # measured on 4 real ranks
    assert capsys.readouterr().out.strip() == (
        "✓ task 4: every rank's time inside the all-reduce is within 0.1 s of the prediction, "
        "on 4 ranks with delays the lecture did not run"
    )
    # the verdict logic on a fixed measurement: the wrong ideas fail without more launches
    monkeypatch.setattr(unit08, "_measure_straggler", lambda sleeps: [0.3, 0.002, 0.2, 0.3])
    with pytest.raises(AssertionError, match=r"✗ task 4: sleeps .* in 3 runs: rank 0"):
        unit08.check_straggler_prediction(lambda sleeps: [0.0] * len(sleeps))  # "no waiting"
    with pytest.raises(AssertionError, match=r"✗ task 4: sleeps .*predicted .* measured"):
        unit08.check_straggler_prediction(lambda sleeps: list(sleeps))  # its own delay
    with pytest.raises(AssertionError, match="expected a list of 4 numbers"):
        unit08.check_straggler_prediction(lambda sleeps: 0.3)
    with pytest.raises(AssertionError, match="✗ task 4: uses the course's own straggler"):
        from course_lib.units.u08_collectives import run_patterns  # measuring, not predicting

        unit08.check_straggler_prediction(
            lambda sleeps: run_patterns.straggler(sleeps)["in_all_reduce_s"].tolist()
        )


def _fixed_average(grad):
    out = grad.clone()
    dist.all_reduce(out)
    return out / dist.get_world_size()


def test_fixed_average_passes_the_fix_and_fails_the_bug(capsys):
    from course_lib.units.u08_collectives import checks as unit08

    unit08.check_fixed_average(_fixed_average)
    assert capsys.readouterr().out.startswith("✓ task 5: every rank holds the mean gradient")
    with pytest.raises(
        AssertionError,
        match=r"✗ task 5: .*returned shape \((\d+),\), expected the gradient's \(\d+,\)",
    ) as bug:
        unit08.check_fixed_average(unit08.buggy_average_gradients)
    (n,) = re.search(r"of shape \((\d+),\)", str(bug.value)).groups()
    assert f"returned shape ({2 * int(n)},)" in str(bug.value)  # all_gather: N = 2 times longer
    with pytest.raises(AssertionError, match=r"✗ task 5: .*max abs difference"):
        unit08.check_fixed_average(lambda g: (dist.all_reduce(g), g)[1])  # a sum, not a mean
    with pytest.raises(AssertionError, match="✗ task 5: uses the course's own ring_all_reduce"):
        unit08.check_fixed_average(
            lambda g: course_C.ring_all_reduce(g.clone()) / dist.get_world_size()
        )


def _bytes(n_params, world_size, scheme):
    s, n = 2 * n_params, world_size
    return {
        "all_reduce": 2 * (n - 1) * s / n,
        "zero3": 3 * (n - 1) * s / n,
        "parameter_server": (n - 1) * s,
    }[scheme]


def test_scale_bytes(capsys, seed):
    from course_lib.units.u08_collectives import checks as unit08

    unit08.check_scale_bytes(_bytes)
    assert capsys.readouterr().out == (
        "✓ task 6: bytes per step match estimate for 7B and 70B on 8 and 64 GPUs and an unseen "
        "size (70B on 64: "
        "all-reduce 276 GB, ZeRO-3 413 GB, parameter server 8,820 GB)\n"
    )
    with pytest.raises(AssertionError, match="✗ task 6: .*zero3"):  # "sharding is free": 2(N-1)/N S
        unit08.check_scale_bytes(lambda p, w, s: _bytes(p, w, "all_reduce" if s == "zero3" else s))
    with pytest.raises(AssertionError, match="✗ task 6: .*all_reduce"):  # fp32 gradients
        unit08.check_scale_bytes(lambda p, w, s: 2 * _bytes(p, w, s))
    with pytest.raises(
        AssertionError, match="✗ task 6: uses the course's own ring_allreduce_bytes_sent"
    ):
        unit08.check_scale_bytes(lambda p, w, s: estimate.ring_allreduce_bytes_sent(2 * p, w))


def test_copied_answers_fail_under_another_seed(monkeypatch):
    from course_lib.units.u08_collectives import checks as unit08

    copied_fails(monkeypatch, unit08.check_scale_bytes, _bytes, task=6)
    # task 4: the verdict on a measurement that follows the rule, without launching ranks
    monkeypatch.setattr(unit08, "_measure_straggler", _wait)
    copied_fails(monkeypatch, unit08.check_straggler_prediction, _wait, task=4)


def test_the_drawn_delays_are_not_the_lecture_s(seed):
    from course_lib.units.u08_collectives import checks as unit08

    sleeps = unit08.straggler_sleeps()
    assert len(sleeps) == 4 and min(sleeps) == 0.0 and 0.2 <= max(sleeps) <= 0.4
    assert list(sleeps) != [0.0, 0.2, 0.0, 0.0]


@pytest.mark.slow  # launches the reference rings on 2 and 4 ranks twice
def test_copied_composite_bytes_fail_under_another_seed(monkeypatch):
    from course_lib.units.u08_collectives import checks as unit08

    copied_fails(
        monkeypatch, unit08.check_composite_bytes, lambda s, n: 2 * (n - 1) * s / n, task=3
    )


def test_the_ring_sizes_are_drawn_and_never_split_evenly(monkeypatch):
    """Tasks 1, 2 and 5 run on sizes and data drawn from the grading seed: a learner cannot tune
    a ring to the lecture's sizes, and the drawn sizes keep unequal chunks on 2, 3 and 4 ranks."""
    from course_lib.grading.seeds import case_rng
    from course_lib.units.u08_collectives.checks_ranks import draw_ring_case

    drawn = {}
    for seed in ("0", "7", "12345"):
        monkeypatch.setenv("COURSE_GRADE_SEED", seed)
        drawn[seed] = {task: draw_ring_case(case_rng(task, "u08_collectives")) for task in (1, 2)}
        for numels, data_seed, chunk in drawn[seed].values():
            assert numels[0] == 1 and 64 <= chunk <= 1024 and 0 <= data_seed < 2**31
            assert all(n % w for n in numels[1:] for w in (2, 3, 4)), numels
    assert drawn["0"] != drawn["7"] != drawn["12345"]
    assert drawn["0"][1] != drawn["0"][2]  # each task draws its own


def test_the_averaged_shapes_are_drawn(monkeypatch):
    from course_lib.units.u08_collectives import checks as unit08

    seen = []
    monkeypatch.setattr(
        unit08,
        "_launch_learner",
        lambda task, worker, n, fn, shapes, seed: (
            seen.append((n, shapes, seed)) or [{"cases": []}] * n
        ),
    )
    for seed in ("0", "7"):
        monkeypatch.setenv("COURSE_GRADE_SEED", seed)
        unit08.collect_fixed_average(lambda g: g)  # the learner's side: what it launches
    assert [n for n, *_ in seen] == [2, 3, 2, 3]
    assert seen[0][1:] == seen[1][1:] and seen[0][1:] != seen[2][1:]


def test_judges_refuse_malformed_data():
    # the judge half trusts nothing the learner's side hands back: a ✗, never a ✓ or a crash
    # (none of these reaches a judge's own launch of the reference rings)
    from course_lib.units.u08_collectives import checks as unit08

    ranks = [[{}] * n for n in (2, 3, 4)]
    p2p = [{"op": "isend", "bytes": 4, "async": True}]
    ring = [[{"results": [torch.zeros(1)] * 6, "calls": p2p}] * n for n in (2, 3, 4)]
    junk = [None, {}, [], "✓", 3, {"runs": None}, {"runs": ranks}, {"runs": ranks[:2]}]
    junk += [{"runs": ring}, {"runs": [[{"outs": ["int", 3]}] * 2, [{"outs": []}] * 3]}]
    junk += [{"cases": [0] * 6, "runs": [0, 0]}, {"wait_s": [0.1, 0.2, "0.3", 0.0]}]
    junk += [[float("nan")] * 15, [None] * 15]
    checks = [
        unit08.check_ring_all_reduce,
        unit08.check_ring_all_gather,
        unit08.check_composite_bytes,
        unit08.check_straggler_prediction,
        unit08.check_fixed_average,
        unit08.check_scale_bytes,
    ]
    for check in checks:
        for data in junk:
            with pytest.raises(AssertionError, match=rf"✗ task {check.task}: "):
                check.run_judge(data)
