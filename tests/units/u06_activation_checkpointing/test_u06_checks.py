"""Unit 06's graded checks: a correct answer passes, a wrong one fails with ✗, the course's own is
refused, under two grading seeds; a table of the default seed's answers fails under another."""

from __future__ import annotations

import pytest
from _grading_seeds import copied_fails, seed_fixture  # noqa: F401 (the seed fixture)
from torch.utils.checkpoint import checkpoint

from course_lib.measure import estimate
from course_lib.techniques import checkpointing as ck
from course_lib.units.u06_activation_checkpointing import checks, run

OPTIONS = [("none", 1, ck.MATMUL_OPS)] + [
    ("selective", 1, ops) for ops in (ck.MATMUL_OPS, ("mm", "addmm"), ("bmm",))
]


def pick(config, batch, seq, budget):
    """A learner's answer: enumerate the options with the exact formulas, keep the cheapest that fits."""
    opts = OPTIONS + [
        (p, k, ck.MATMUL_OPS) for p in ("every_k", "segments") for k in range(1, config.n_layer + 1)
    ]
    best = None
    for policy, k, ops in opts:
        kept = estimate.checkpointed_activation_bytes_gpt(
            config, batch, seq, policy=policy, k=k, save_ops=ops
        )
        if kept <= budget:
            rec = estimate.gpt_step_matmul_flops(
                config, batch, seq, policy=policy, k=k, save_ops=ops
            )["recompute"]
            if best is None or (rec, kept) < best[0]:
                best = ((rec, kept), {"policy": policy, "k": k, "save_ops": ops})
    return best[1]


def predict(config, batch, seq, policy, k):
    """A learner's answer, from the per-block count (no course function)."""
    B, T, C = batch, seq, config.n_embd
    plain = 16 * B * T * C + 4 * B * T + config.n_head * B * T * T
    kept = [
        B * T * C if policy != "none" and i % k == 0 else (0 if policy == "segments" else plain)
        for i in range(config.n_layer)
    ]
    return 4 * (sum(kept) + 2 * B * T * C + 2 * B * T + B * T * config.vocab_size)


def test_correct_answers_pass(capsys, seed):
    checks.check_pick_policy(pick)
    checks.check_rng_fix(lambda block, x: checkpoint(block, x, use_reentrant=False))
    checks.check_predict_kept_bytes(predict)
    assert [ln[:8] for ln in capsys.readouterr().out.splitlines()] == [
        "✓ task 1",
        "✓ task 2",
        "✓ task 3",
    ]


def test_wrong_answers_fail(seed):
    with pytest.raises(AssertionError, match=r"✗ task 1: budget .* fits but recomputes"):
        checks.check_pick_policy(lambda c, b, s, budget: {"policy": "full", "k": 1})
    with pytest.raises(AssertionError, match=r"✗ task 1: budget .* more than the budget"):
        checks.check_pick_policy(lambda c, b, s, budget: {"policy": "none", "k": 1})
    with pytest.raises(AssertionError, match=r"✗ task 1: pick\(...\) must return a dict"):
        checks.check_pick_policy(lambda c, b, s, budget: "full")
    with pytest.raises(AssertionError, match=r"✗ task 2: gradient of .* same dropout masks"):
        checks.check_rng_fix(
            lambda block, x: checkpoint(block, x, use_reentrant=False, preserve_rng_state=False)
        )
    with pytest.raises(AssertionError, match=r"✗ task 2: each block should run twice"):
        checks.check_rng_fix(lambda block, x: block(x))
    with pytest.raises(
        AssertionError, match=r"✗ task 3: .*policy='full'.*not what MemoryMeter measured"
    ):
        checks.check_predict_kept_bytes(
            lambda c, b, s, p, k: (
                predict(c, b, s, "none", 1) if p != "none" else predict(c, b, s, p, k)
            )
        )
    with pytest.raises(AssertionError, match=r"✗ task 3: predict_kept_bytes must return an int"):
        checks.check_predict_kept_bytes(lambda *a: float(predict(*a)))
    with pytest.raises(AssertionError, match=r"✗ task 2: not implemented yet: <lambda> raised"):
        checks.check_rng_fix(lambda block, x: (_ for _ in ()).throw(NotImplementedError()))


def test_the_course_answers_are_refused(seed):
    with pytest.raises(
        AssertionError, match=r"✗ task 1: uses the course's own cheapest_fitting_policy"
    ):
        checks.check_pick_policy(run.cheapest_fitting_policy)
    with pytest.raises(AssertionError, match=r"✗ task 2: uses the course's own Checkpointed"):
        checks.check_rng_fix(lambda block, x: ck.Checkpointed([block])(x))
    with pytest.raises(
        AssertionError, match=r"✗ task 3: uses the course's own checkpointed_activation_bytes_gpt"
    ):
        checks.check_predict_kept_bytes(
            lambda c, b, s, p, k: estimate.checkpointed_activation_bytes_gpt(c, b, s, policy=p, k=k)
        )


@pytest.mark.slow  # measures every option of task 1 on two drawn GPTs
def test_copied_answers_fail_under_another_seed(monkeypatch):
    copied_fails(monkeypatch, checks.check_pick_policy, pick, task=1)
    copied_fails(monkeypatch, checks.check_predict_kept_bytes, predict, task=3)
