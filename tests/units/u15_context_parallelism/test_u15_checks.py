"""Unit 15's graded checks: a correct answer passes, a wrong one fails with a ✗ line, one that
calls the course's own answer is refused."""

from __future__ import annotations

import math

import pytest
import torch
from _grading_seeds import FIXTURE_SEEDS  # seed 0: tests/_grading_seeds.py

from course_lib.units.u15_context_parallelism import checks as C


def good_merge(out_a, lse_a, out_b, lse_b):
    lse = torch.maximum(lse_a, lse_b) + torch.log(
        torch.exp(lse_a - torch.maximum(lse_a, lse_b))
        + torch.exp(lse_b - torch.maximum(lse_a, lse_b))
    )
    return out_a * torch.exp(lse_a - lse)[..., None] + out_b * torch.exp(lse_b - lse)[
        ..., None
    ], lse


def naive_merge(out_a, lse_a, out_b, lse_b):  # exp overflows float32 for large scores
    ea, eb = torch.exp(lse_a), torch.exp(lse_b)
    return (out_a * ea[..., None] + out_b * eb[..., None]) / (ea + eb)[..., None], torch.log(
        ea + eb
    )


def average_merge(out_a, lse_a, out_b, lse_b):  # weights the two halves equally
    return (out_a + out_b) / 2, torch.logaddexp(lse_a, lse_b)


def course_merge(out_a, lse_a, out_b, lse_b):
    from course_lib.parallel.context import merge_attention

    return merge_attention(out_a, lse_a, out_b, lse_b)


def test_check_merge(seed, capsys):
    C.check_merge(good_merge)
    assert capsys.readouterr().out.startswith("✓ task 1: your merge equals attention")
    with pytest.raises(AssertionError, match=r"✗ task 1: case \d: out differs"):
        C.check_merge(average_merge)
    with pytest.raises(AssertionError, match=r"✗ task 1: case [56]: out differs"):
        C.check_merge(naive_merge)
    with pytest.raises(AssertionError, match="✗ task 1: uses the course's own merge_attention"):
        C.check_merge(course_merge)


def _block(q, k, v, mask):
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        s = s.masked_fill(mask, float("-inf"))
    lse = torch.logsumexp(s, -1)
    return torch.exp(s - lse[..., None]) @ v, lse


def good_step(q, k, v, *, rank, src):
    if src > rank:
        return None
    n = q.shape[2]
    mask = torch.ones(n, n, dtype=torch.bool).triu(1) if src == rank else None
    return _block(q, k, v, mask)


def buggy_step(q, k, v, *, rank, src):  # the lecture's bug: the mask on every block
    if src > rank:
        return None
    n = q.shape[2]
    return _block(q, k, v, torch.ones(n, n, dtype=torch.bool).triu(1))


def course_step(q, k, v, *, rank, src):
    from course_lib.parallel.context import ring_attention

    return ring_attention(q, k, v) if src == rank else None, None


def test_check_ring_block(seed, capsys):
    C.check_ring_block(good_step)
    assert capsys.readouterr().out.startswith("✓ task 2: your ring step")
    with pytest.raises(AssertionError, match="✗ task 2: 2 ranks: the output differs"):
        C.check_ring_block(buggy_step)
    with pytest.raises(AssertionError, match="✗ task 2: uses the course's own"):
        C.check_ring_block(course_step)


def good_llama(cp, seq):
    s, h, f, t, p = seq // cp, 16384, 53248, 8, 2
    inside = p * (2 * s * h + 2 * s * h // 16 + 3 * s * f)  # q, out, K and V at 1/16, SwiGLU
    outside = 4 * p * s * h
    kv = 2 * s * (8 // t) * 128 * p
    return (inside + outside) // t, 2 * (cp - 1) * kv


@pytest.fixture(params=FIXTURE_SEEDS)
def seed(request, monkeypatch):
    monkeypatch.setenv("COURSE_GRADE_SEED", request.param)
    return request.param


def test_check_llama_cp(seed, capsys):
    C.check_llama_cp(good_llama)
    assert capsys.readouterr().out.startswith("✓ task 3: Llama 3 405B")
    with pytest.raises(
        AssertionError, match=r"✗ task 3: cp \d+, \d+K tokens: activation_bytes = .*too large"
    ):
        C.check_llama_cp(lambda cp, seq: (good_llama(cp, seq)[0] * 2, good_llama(cp, seq)[1]))
    with pytest.raises(AssertionError, match="✗ task 3: sent_bytes must be an int, got float"):
        C.check_llama_cp(lambda cp, seq: (good_llama(cp, seq)[0], float(good_llama(cp, seq)[1])))

    def course(cp, seq):
        from course_lib.measure import estimate

        return 0, estimate.cp_comm_bytes_per_layer(seq, 1, 16384, 128, cp, method="allgather")[
            "sent"
        ]

    with pytest.raises(AssertionError, match="✗ task 3: uses the course's own cp_comm"):
        C.check_llama_cp(course)


def test_the_lectures_cp_or_a_copied_answer_fails(monkeypatch):
    from course_lib.grading.seeds import case_rng

    lecture = good_llama(16, 2**17)
    copied = good_llama(*case_rng(3, C.UNIT).choice(C.LLAMA_PLANS))  # seed 0's
    C.check_llama_cp(lambda cp, seq: copied)
    monkeypatch.setenv("COURSE_GRADE_SEED", "7")
    for answer in (lecture, copied):
        with pytest.raises(AssertionError, match="✗ task 3: cp "):
            C.check_llama_cp(lambda cp, seq, a=answer: a)
