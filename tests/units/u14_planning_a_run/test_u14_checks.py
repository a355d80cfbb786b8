"""Unit 14's graded checks: a right answer passes, a wrong one fails with a ✗ line, one that calls
the course's own planner is refused."""

from __future__ import annotations

import answers as A  # noqa: E402  (this folder is on sys.path: pytest prepends it)
import pytest

from course_lib.units.u14_planning_a_run import checks as C


def test_sized_run(capsys):
    C.check_sized_run(A.sized_run)
    assert capsys.readouterr().out.startswith("✓ task 1: the layout fits")

    def too_slow():
        return dict(dp=8, tp=8, pp=1, zero=1, recompute="selective", micro_batch=1), 58.7e9

    with pytest.raises(AssertionError, match=r"✗ task 1: it fits but takes 33.8 days > 31"):
        C.check_sized_run(too_slow)
    too_big = lambda: (dict(dp=16, tp=4, pp=1, zero=1, recompute="selective", micro_batch=1), 1e11)  # noqa: E731
    with pytest.raises(AssertionError, match=r"✗ task 1: it does not fit: 104.5 GB per GPU > 76.0"):
        C.check_sized_run(too_big)
    wrong_memory = lambda: (A.sized_run()[0], 50e9)  # noqa: E731
    with pytest.raises(AssertionError, match=r"your memory prediction 50.0 GB is more than 10 %"):
        C.check_sized_run(wrong_memory)
    with pytest.raises(AssertionError, match=r"layout\['dp'\] must be int, got float"):
        C.check_sized_run(lambda: ({**A.sized_run()[0], "dp": 16.0}, 1e9))
    with pytest.raises(AssertionError, match="dp x tp x pp = 48: use all 64 GPUs"):
        C.check_sized_run(
            lambda: (dict(dp=16, tp=3, pp=1, zero=1, recompute="full", micro_batch=1), 1e9)
        )
    with pytest.raises(
        AssertionError,
        match="the planner refuses this layout: tp = 16: expected a divisor of heads = 64 and kv_heads = 8",
    ):
        C.check_sized_run(
            lambda: (dict(dp=4, tp=16, pp=1, zero=1, recompute="full", micro_batch=1), 1e9)
        )

    def course():
        from course_lib import plan as P
        from course_lib.units.u14_planning_a_run.run import plan_run

        top = plan_run("Llama-2-70B", gpus=64, total_tokens=200e9).iloc[0]
        return dict(
            dp=int(top.dp),
            tp=int(top.tp),
            pp=int(top.pp),
            zero=int(top.zero),
            recompute=top.recompute,
            micro_batch=int(top.micro_batch),
        ), top.memory_GB * 1e9 + 0 * len(P.RECOMPUTE)

    with pytest.raises(AssertionError, match="✗ task 1: uses the course's own"):
        C.check_sized_run(course)


def test_plan_problems(capsys):
    C.check_plan_problems(A.problems)
    assert capsys.readouterr().out.startswith("✓ task 2: the problems of all 8 plans")

    def node_blind(model, cluster, layout, tokens):  # forgets that a node has only 8 GPUs
        return A.problems(model, cluster, layout, tokens) - {"tp_across_nodes"}

    with pytest.raises(
        AssertionError, match=r"✗ task 2: plan 3 .* expected \['tp_across_nodes'\], got no problem"
    ):
        C.check_plan_problems(node_blind)
    with pytest.raises(AssertionError, match="must return a set of problem names, got list"):
        C.check_plan_problems(lambda *a: [])

    def course(model, cluster, layout, tokens):
        from course_lib.units.u14_planning_a_run.run import plan_problems

        return plan_problems(model, cluster, layout, tokens)

    with pytest.raises(AssertionError, match="✗ task 2: uses the course's own plan_problems"):
        C.check_plan_problems(course)


def test_mfu_prediction(capsys):
    C.check_mfu_prediction(A.predict_mfu)
    assert capsys.readouterr().out.startswith("✓ task 3: the MFU at twice the sequence length")

    def six_n_only(parts, model, layout, new_seq):  # forgets attention FLOPs and the bubble
        return parts["mfu"]

    with pytest.raises(
        AssertionError,
        match=r"✗ task 3: Llama-2-7B, DP 1 x TP 2 x PP 4, selective .* you predicted",
    ):
        C.check_mfu_prediction(six_n_only)

    def course(parts, model, layout, new_seq):
        from course_lib import plan as P

        return P.step_time(
            model.replace(seq_len=new_seq),
            P.cluster("8xH100 + 400G IB", gpus=layout.gpus),
            layout,
            global_batch_tokens=2**20,
        )["mfu"]

    with pytest.raises(AssertionError, match="✗ task 3: uses the course's own step_time"):
        C.check_mfu_prediction(course)
