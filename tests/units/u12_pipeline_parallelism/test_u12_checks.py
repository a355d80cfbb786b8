"""Unit 12's graded checks: a correct answer passes, a wrong one fails with a ✗ line, one that
calls the course's own answer is refused."""

from __future__ import annotations

import pytest

from course_lib.units.u12_pipeline_parallelism import checks as C


def good_bubble(p, m, v):
    return (p - 1) / (v * m + p - 1)


def narayanan_bubble(p, m, v):  # the other definition: bubble over ideal time
    return (p - 1) / (v * m)


def course_bubble(p, m, v):
    from course_lib.measure import estimate

    return estimate.pipeline_bubble_fraction(p, m, v)


def good_order(stage, stages, m):
    warmup = min(stages - stage - 1, m)
    order = [("F", i) for i in range(warmup)]
    for i in range(m - warmup):
        order += [("F", warmup + i), ("B", i)]
    return order + [("B", i) for i in range(m - warmup, m)]


def gpipe_order(stage, stages, m):
    return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]


def course_order(stage, stages, m):
    from course_lib.parallel.pipeline import one_f_one_b_order

    return [(a.kind, a.microbatch) for a in one_f_one_b_order(stage, stages, m)]


def good_holder(stage, ranks):
    return stage % ranks


def buggy_holder(stage, ranks):
    return stage // ranks


def course_holder(stage, ranks):
    from course_lib.parallel.pipeline import stage_owner

    return stage_owner(stage, ranks)


def test_bubble_check(capsys):
    C.check_bubble_prediction(good_bubble)
    assert capsys.readouterr().out.startswith("✓ task 1: interleaved 1F1B idle fraction")
    with pytest.raises(AssertionError, match=r"✗ task 1: p = 3, m = 3, v = 2: .* you predicted"):
        C.check_bubble_prediction(narayanan_bubble)
    with pytest.raises(
        AssertionError, match="✗ task 1: uses the course's own pipeline_bubble_fraction"
    ):
        C.check_bubble_prediction(course_bubble)
    with pytest.raises(AssertionError, match="must return a finite float, got str"):
        C.check_bubble_prediction(lambda p, m, v: "0.2")


def test_order_check(capsys):
    C.check_one_f_one_b(good_order)
    assert capsys.readouterr().out.startswith("✓ task 2: 1F1B orders match")
    with pytest.raises(
        AssertionError, match=r"✗ task 2: stage 0 of p = 4, m = 8: action 4 should be \('B', 0\)"
    ):
        C.check_one_f_one_b(gpipe_order)
    with pytest.raises(AssertionError, match="✗ task 2: uses the course's own one_f_one_b_order"):
        C.check_one_f_one_b(course_order)


def test_holder_check(capsys):
    from _rewritten import rewritten

    C.check_holder(rewritten("course_lib.parallel.pipeline").stage_owner)
    assert capsys.readouterr().out.startswith("✓ task 3: stages placed round robin")
    with pytest.raises(AssertionError, match="✗ task 3: stage 1 with 2 ranks: .* rank 1, but your"):
        C.check_holder(buggy_holder)
    with pytest.raises(AssertionError, match="✗ task 3: uses the course's own stage_owner"):
        C.check_holder(course_holder)
    with pytest.raises(AssertionError, match="must return an int rank, got float"):
        C.check_holder(lambda k, p: float(k % p))
