"""Unit 14's graded checks: a right answer passes, a wrong one fails with a ✗ line, one that calls
the course's own planner is refused; under two grading seeds, and an answer copied from seed 0's
cases or the lecture fails under another."""

from __future__ import annotations

import answers as A  # noqa: E402  (this folder is on sys.path: pytest prepends it)
import pytest
from _grading_seeds import FIXTURE_SEEDS  # seed 0: tests/_grading_seeds.py

from course_lib.units.u14_planning_a_run import _cases as K
from course_lib.units.u14_planning_a_run import checks as C

SEEDS = ("0", "7")


@pytest.fixture(params=FIXTURE_SEEDS)
def seed(request, monkeypatch):
    monkeypatch.setenv("COURSE_GRADE_SEED", request.param)
    return request.param


def test_sized_run(seed, capsys):
    C.check_sized_run(A.sized_run)
    assert capsys.readouterr().out == (
        "✓ task 1: the layout fits in 76 GB per GPU, finishes within the budget, and your "
        "memory is within 10 % of the planner's\n"
    )
    case = K.size_case(1)
    gpus = case["gpus"]
    where = rf"✗ task 1: {gpus} GPUs, .*B tokens, .* days: "
    slow = dict(dp=gpus // 32, tp=8, pp=4, zero=1, recompute="full", micro_batch=1)
    with pytest.raises(AssertionError, match=where + "it fits but takes .* days >"):
        C.check_sized_run(lambda g, t, d: (slow, 40e9))
    too_big = dict(dp=gpus, tp=1, pp=1, zero=1, recompute="selective", micro_batch=1)
    with pytest.raises(AssertionError, match=where + "it does not fit"):
        C.check_sized_run(lambda g, t, d: (too_big, 1e11))
    with pytest.raises(AssertionError, match=where + "your memory prediction 20.0 GB is more than"):
        C.check_sized_run(lambda g, t, d: (A.sized_run(g, t, d)[0], 20e9))
    with pytest.raises(AssertionError, match=r"layout\['dp'\] must be int, got float"):
        C.check_sized_run(lambda g, t, d: ({**A.sized_run(g, t, d)[0], "dp": 16.0}, 1e9))
    with pytest.raises(AssertionError, match=f"dp x tp x pp = 48: use all {gpus} GPUs"):
        C.check_sized_run(
            lambda g, t, d: (dict(dp=16, tp=3, pp=1, zero=1, recompute="full", micro_batch=1), 1e9)
        )

    def course(gpus, total_tokens, budget_days):
        from course_lib.units.u14_planning_a_run.run import plan_run

        top = plan_run("Llama-2-70B", gpus=gpus, total_tokens=total_tokens).iloc[0]
        return dict(
            dp=int(top.dp),
            tp=int(top.tp),
            pp=int(top.pp),
            zero=int(top.zero),
            recompute=top.recompute,
            micro_batch=int(top.micro_batch),
        ), top.memory_GB * 1e9

    with pytest.raises(AssertionError, match="✗ task 1: uses the course's own"):
        C.check_sized_run(course)


def test_the_lecture_layout_or_seed_0s_answer_fails_under_another_seed(monkeypatch):
    # the lecture's 70B plan on 64 GPUs (ZeRO-3 over 32 replicas, TP 2): 64 GPUs are never drawn
    lecture = dict(dp=32, tp=2, pp=1, zero=3, recompute="selective", micro_batch=1)
    case = K.size_case(1)
    copied = A.sized_run(case["gpus"], case["total_tokens"], case["budget_days"])
    C.check_sized_run(lambda g, t, d: copied)
    for s in SEEDS:
        monkeypatch.setenv("COURSE_GRADE_SEED", s)
        with pytest.raises(AssertionError, match="dp x tp x pp = 64: use all .* GPUs"):
            C.check_sized_run(lambda g, t, d: (lecture, 40e9))
    other = next(s for s in map(str, range(1, 50)) if _gpus_at(monkeypatch, s) != case["gpus"])
    monkeypatch.setenv("COURSE_GRADE_SEED", other)  # a layout for other GPUs: refused
    with pytest.raises(AssertionError, match="✗ task 1: .* use all"):
        C.check_sized_run(lambda g, t, d: copied)


def _gpus_at(monkeypatch, seed):
    monkeypatch.setenv("COURSE_GRADE_SEED", seed)
    return K.size_case(1)["gpus"]


def test_plan_problems(seed, capsys):
    C.check_plan_problems(A.problems)
    assert capsys.readouterr().out.startswith("✓ task 2: the problems of all 8 drawn plans")

    def node_blind(model, cluster, layout, tokens):  # forgets that a node has only 8 GPUs
        return A.problems(model, cluster, layout, tokens) - {"tp_across_nodes"}

    with pytest.raises(
        AssertionError,
        match=r"✗ task 2: plan \d .* TP 16 .*: you found .*; \d problem\(s\) in this",
    ) as err:
        C.check_plan_problems(node_blind)
    assert "tp_across_nodes" not in str(err.value).split("you found")[1].split(";")[1]
    with pytest.raises(AssertionError, match="must return a set of problem names, got list"):
        C.check_plan_problems(lambda *a: [])

    def course(model, cluster, layout, tokens):
        from course_lib.units.u14_planning_a_run.run import plan_problems

        return plan_problems(model, cluster, layout, tokens)

    with pytest.raises(AssertionError, match="✗ task 2: uses the course's own plan_problems"):
        C.check_plan_problems(course)


def test_the_plans_cover_each_problem_and_a_copied_table_fails(monkeypatch):
    from course_lib import plan as P
    from course_lib.units.u14_planning_a_run.run import plan_problems

    def found(cases):
        return [
            plan_problems(
                P.model(n), P.cluster(K.CLUSTER, gpus=g), P.Layout(*lay[:3], micro_batch=lay[3]), t
            )
            for n, g, lay, t in cases
        ]

    table = found(K.problem_cases(2))  # seed 0's answers, in order
    assert sorted(map(len, table)) == [0, 0, 1, 1, 1, 1, 2, 2]
    answers = iter(table * 2)
    C.check_plan_problems(lambda *a: next(answers))
    monkeypatch.setenv("COURSE_GRADE_SEED", "7")
    assert found(K.problem_cases(2)) != table
    with pytest.raises(AssertionError, match="✗ task 2: plan"):
        C.check_plan_problems(lambda *a: next(answers))


def test_mfu_prediction(seed, capsys):
    C.check_mfu_prediction(A.predict_mfu)
    assert capsys.readouterr().out == (
        "✓ task 3: the MFU at a longer sequence matches the planner to 1 % for 2 drawn layouts\n"
    )

    def six_n_only(parts, model, layout, new_seq):  # forgets attention FLOPs and the bubble
        return parts["mfu"]

    with pytest.raises(
        AssertionError,
        match=r"✗ task 3: Llama-2-7B, DP \d+ x TP \d x PP \d, .* you predicted .* (below|above) the planner",
    ):
        C.check_mfu_prediction(six_n_only)

    def course(parts, model, layout, new_seq):
        from course_lib import plan as P

        return P.step_time(
            model.replace(seq=new_seq),
            P.cluster("8xH100 + 400G IB", gpus=layout.gpus),
            layout,
            global_batch_tokens=2**20,
        )["mfu"]

    with pytest.raises(AssertionError, match="✗ task 3: uses the course's own step_time"):
        C.check_mfu_prediction(course)


def test_copied_mfus_fail_under_another_seed(monkeypatch):
    seen = []

    def record(parts, model, layout, new_seq):
        seen.append(A.predict_mfu(parts, model, layout, new_seq))
        return seen[-1]

    C.check_mfu_prediction(record)  # seed 0's answers, in order
    answers = iter(seen * 2)
    C.check_mfu_prediction(lambda *a: next(answers))
    monkeypatch.setenv("COURSE_GRADE_SEED", "7")
    with pytest.raises(AssertionError, match="✗ task 3: "):
        C.check_mfu_prediction(lambda *a: next(answers))


def test_task_3_draws_a_whole_layout_under_every_seed(monkeypatch):
    """Every drawn layout fills its GPUs with at least one data-parallel rank (a seed once drew
    TP 4 x PP 4 on 8 GPUs: dp 0, and the grade stopped with an error instead of a verdict)."""
    from course_lib.units.u14_planning_a_run._cases import mfu_cases

    tp4pp4 = 0
    for seed in range(400):
        monkeypatch.setenv("COURSE_GRADE_SEED", str(seed))
        for c in mfu_cases(3):
            dp, tp, pp = c["layout"]
            assert dp >= 1 and dp * tp * pp == c["gpus"], (seed, c)
            tp4pp4 += (tp, pp, c["gpus"]) == (4, 4, 16)
    assert tp4pp4 > 0  # the case that broke is still drawn
