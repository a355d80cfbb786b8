"""Unit 16's graded checks: a correct answer passes, a wrong one fails with a ✗ line, one that
calls the course's own answer is refused, a float where an int is asked is refused."""

from __future__ import annotations

import math

import pytest
import torch
from _grading_seeds import FIXTURE_SEEDS  # seed 0: tests/_grading_seeds.py

from course_lib import kit
from course_lib.units.u16_mixture_of_experts import checks as C


def good_plan(routed, rank, n_experts):
    w = len(routed)
    order = torch.argsort(routed[rank], stable=True)
    counts = [torch.bincount(r, minlength=n_experts).view(w, -1) for r in routed]
    return order, counts[rank].sum(1).tolist(), [int(c[rank].sum()) for c in counts]


def swapped_plan(routed, rank, n_experts):  # input and output splits swapped
    order, send, recv = good_plan(routed, rank, n_experts)
    return order, recv, send


def course_plan(routed, rank, n_experts):
    from course_lib.parallel.experts.dispatch import dispatch_splits

    w = len(routed)
    counts = torch.bincount(routed[rank], minlength=n_experts)
    recv = torch.cat([torch.bincount(r, minlength=n_experts).view(w, -1)[rank] for r in routed])
    send, got = dispatch_splits(counts, recv, w)
    return torch.argsort(routed[rank], stable=True), send, got


@pytest.fixture(params=FIXTURE_SEEDS)
def seed(request, monkeypatch):
    monkeypatch.setenv("COURSE_GRADE_SEED", request.param)
    return request.param


def test_check_dispatch(seed):
    kit.check_table(
        C.check_dispatch,
        [
            (good_plan, "✓ task 1: your dispatch plan is right"),
            (swapped_plan, r"✗ task 1: case \d+ .*input_splits"),
            (course_plan, "✗ task 1: uses the course's own"),
        ],
    )


def good_loss(probs, experts):
    n = probs.shape[1]
    f = torch.bincount(experts.reshape(-1), minlength=n).float() / experts.numel()
    return n * (f * probs.mean(0)).sum()


def wrong_axis_loss(probs, experts):  # the exercise's bug: P averaged over the experts
    n = probs.shape[1]
    f = torch.bincount(experts.reshape(-1), minlength=n).float() / experts.numel()
    return n * (f * probs.mean(1, keepdim=True)).sum()


def course_loss(probs, experts):
    from course_lib.parallel.experts.moe import load_balancing_loss

    return load_balancing_loss(probs, experts)


def test_check_balance_loss(seed):
    kit.check_table(
        C.check_balance_loss,
        [
            (good_loss, "✓ task 2: your balancing loss"),
            (
                wrong_axis_loss,
                r"✗ task 2: case \d+ \(\d+ tokens, \d+ experts, top-\d\): your loss is",
            ),
            (course_loss, "✗ task 2: uses the course's own"),
        ],
    )


def good_mixtral(ep, gpus):
    total, experts = 46_702_792_704, 45_097_156_608
    a2a = 4 * 2 * (ep - 1) * 4096 * 2 // ep
    dense = (2 + 2) * (total - experts) + 12 * (total - experts) // gpus
    routed = ((2 + 2) * experts + 12 * experts // (gpus // ep)) // ep
    return a2a, dense + routed


def forgot_backward(ep, gpus):
    a2a, state = good_mixtral(ep, gpus)
    return a2a // 2, state


def course_mixtral(ep, gpus):
    from course_lib.measure import estimate

    return estimate.ep_all_to_all_bytes_per_token(4096, ep=ep, top_k=2), 0


def float_mixtral(ep, gpus):
    a2a, state = good_mixtral(ep, gpus)
    return float(a2a), state


def test_check_mixtral_plan(seed):
    said = kit.check_table(
        C.check_mixtral_plan,
        [
            (good_mixtral, "✓ task 3: "),
            (forgot_backward, r"✗ task 3: ep \d on \d+ GPUs: a2a_bytes = .*too small"),
            (course_mixtral, "✗ task 3: uses the course's own"),
            (float_mixtral, "✗ task 3: .*must be an int"),
        ],
    )
    assert said[0] == (
        "✓ task 3: Mixtral 8x7B at a drawn ep and cluster: all-to-all bytes per token and memory "
        "per GPU"
    )


def test_the_lectures_plan_or_a_copied_answer_fails(monkeypatch):
    lecture = good_mixtral(8, 128)
    for s in ("0", "7"):
        monkeypatch.setenv("COURSE_GRADE_SEED", s)
        with pytest.raises(AssertionError, match="✗ task 3: "):
            C.check_mixtral_plan(lambda ep, g: lecture)
    from course_lib.grading.seeds import case_rng

    monkeypatch.setenv("COURSE_GRADE_SEED", "0")
    copied = good_mixtral(*case_rng(3, C.UNIT).choice(C.MIXTRAL_PLANS))
    C.check_mixtral_plan(lambda ep, g: copied)
    monkeypatch.setenv("COURSE_GRADE_SEED", "7")
    with pytest.raises(AssertionError, match="✗ task 3: "):
        C.check_mixtral_plan(lambda ep, g: copied)


@pytest.mark.parametrize(
    "junk", [None, {}, [], "x", [None] * 12, [(torch.zeros(3), [1], [2])] * 12]
)
def test_judges_refuse_malformed_data(junk):
    # the judge half trusts nothing the learner's side hands back: a ✗, never a ✓ or a crash
    for check in (C.check_dispatch, C.check_balance_loss, C.check_mixtral_plan, C.check_ep_overlap):
        with pytest.raises(AssertionError, match=rf"✗ task {check.task}: "):
            check.run_judge(junk)


def ep_hiding_right(hidden, ffn, experts, ep, link_GBps, alpha_s):
    compute = 2 * 3 * hidden * ffn / 989e12  # seconds of expert matmuls per row
    wire = 2 * (ep - 1) / ep * hidden * 2 / (link_GBps * 1e9)  # dispatch + combine, per row
    if compute <= wire:
        return math.inf
    return 2 * (ep - 1) * alpha_s / (compute - wire) * ep / experts


def test_check_ep_overlap(seed, capsys):
    from course_lib.units.u16_mixture_of_experts.checks_overlap import ep_answer, ep_cases

    # hand-derived: DeepSeek-V3's experts at ep 64 over one 50 GB/s port never hide (the report's
    # reason to limit each token to 4 nodes): the bytes alone take 6.3x the compute
    ratio = 989e12 / 50e9 * (63 / 64) * 2 / (3 * 2048)
    assert ratio == pytest.approx(6.34, abs=0.01)
    assert math.isinf(ep_answer(7168, 2048, 256, 64, 50.0, 1e-5))
    assert ep_answer(7168, 2048, 256, 64, 450.0, 0.0) == 0.0  # no latency: any batch hides
    C.check_ep_overlap(ep_hiding_right)
    assert capsys.readouterr().out.startswith("✓ task 4: the tokens per expert")
    ungated = lambda h, f, e, ep, b, a: ep_hiding_right(h, f * 2 // 3, e, ep, b, a)  # noqa: E731
    per_rank = lambda h, f, e, ep, b, a: ep_hiding_right(h, f, e, ep, b, a) * e / ep  # noqa: E731
    for wrong in (ungated, per_rank):
        if all(wrong(*c) == ep_answer(*c) for c in ep_cases()):
            continue  # only infinite cases this seed: they cannot tell this mistake apart
        with pytest.raises(AssertionError, match=r"✗ task 4: ep_hiding\("):
            C.check_ep_overlap(wrong)
    with pytest.raises(AssertionError, match="✗ task 4: uses the course's own"):
        C.check_ep_overlap(_course_ep)


def _course_ep(hidden, ffn, experts, ep, link_GBps, alpha_s):
    from course_lib.measure import estimate

    return estimate.ep_overlap_min_tokens_per_expert(
        hidden=hidden, ffn=ffn, experts=experts, ep=ep, link_GBps=link_GBps, alpha_s=alpha_s,
        peak_flops=989e12, gated_mlp=True,
    )  # fmt: skip
