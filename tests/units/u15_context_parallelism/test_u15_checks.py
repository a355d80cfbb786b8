"""Unit 15's graded checks: a correct answer passes, a wrong one fails with a ✗ line, one that
calls the course's own answer is refused."""

from __future__ import annotations

import math

import pytest
import torch
from _grading_seeds import FIXTURE_SEEDS  # seed 0: tests/_grading_seeds.py

from course_lib import kit
from course_lib.units.u15_context_parallelism import checks as C


def good_merge(parts):
    outs = torch.stack([o for o, _ in parts])
    lses = torch.stack([lse for _, lse in parts])
    lse = torch.logsumexp(lses, 0)
    return (outs * torch.exp(lses - lse)[..., None]).sum(0), lse


def _pairwise(merge2):
    """Three parts merged two at a time with a two-part merge (the lecture's way)."""

    def merge(parts):
        acc = parts[0]
        for part in parts[1:]:
            acc = merge2(*acc, *part)
        return acc

    return merge


def lecture_merge(out_a, lse_a, out_b, lse_b):  # the lecture's printed code: NaN for -inf, -inf
    lse = torch.logaddexp(lse_a, lse_b)
    return out_a * torch.exp(lse_a - lse)[..., None] + out_b * torch.exp(lse_b - lse)[
        ..., None
    ], lse


def naive_merge(parts):  # exp overflows float32 for large scores
    e = [torch.exp(lse) for _, lse in parts]
    total = sum(e)
    return sum(o * x[..., None] for (o, _), x in zip(parts, e)) / total[..., None], torch.log(total)


def average_merge(parts):  # weights the parts equally
    return sum(o for o, _ in parts) / len(parts), torch.logsumexp(
        torch.stack([lse for _, lse in parts]), 0
    )


def course_merge(parts):
    from course_lib.parallel.context import merge_attention

    return _pairwise(merge_attention)(parts)


def test_check_merge(seed):
    kit.check_table(
        C.check_merge,
        [
            (good_merge, "✓ task 1: your merge equals masked attention"),
            (average_merge, r"✗ task 1: case \d: out differs"),
            (naive_merge, r"✗ task 1: case [56]: out differs"),
            # the lecture's two-part merge, applied twice, turns a query with two empty parts
            # into NaN
            (_pairwise(lecture_merge), r"✗ task 1: case 1: out differs .* by up to nan"),
            (course_merge, "✗ task 1: uses the course's own merge_attention"),
        ],
    )


def test_every_merge_case_hides_whole_blocks_from_some_queries():
    for q, k, v, sizes, hidden in C._merge_cases(1):
        a, b = sizes[0], sizes[0] + sizes[1]
        assert bool(hidden[0, :b].all()) and not bool(hidden[0].all())  # sees only block 3
        assert bool(hidden[1, b:].all())
        assert bool(hidden[2, :a].all()) and bool(hidden[2, b:].all())
        assert not bool(hidden.all(1).any())  # every query sees some key
        parts = C._parts(q, k, v, sizes, hidden)
        assert torch.isinf(parts[0][1][..., 0]).all() and torch.isinf(parts[1][1][..., 0]).all()
        assert (parts[0][0][..., 0, :] == 0).all()  # an empty part's output is 0


def good_shortest(heads, kv_heads, tp, cp, link_GBps, causal, mfu):
    n = 989e12 * mfu / (link_GBps * 1e9) * max(kv_heads // tp, 1) / (heads // tp)
    return cp * math.ceil(n * (2 if causal else 1))


def test_check_ring_overlap(seed, capsys):
    C.check_ring_overlap(good_shortest)
    assert capsys.readouterr().out.startswith("✓ task 4: the shortest context")
    # hand-derived: Llama 3 405B (128 heads, 8 K/V) at tp 8 over one 50 GB/s port: 19,780 / 16
    # = 1,236.25 tokens per rank, so 1,237 x cp 16 = 19,792 tokens; full MHA: 19,780 x 16
    from course_lib.units.u15_context_parallelism import checks_overlap as O

    assert O.ring_answer(128, 8, 8, 16, 50.0, False) == 1237 * 16
    assert O.ring_answer(32, 32, 1, 16, 50.0, False) == 19780 * 16
    assert O.ring_answer(32, 32, 1, 16, 50.0, True) == 39560 * 16
    no_tp = lambda h, kv, tp, cp, b, c, m: good_shortest(h, kv, 1, cp, b, c, m)  # noqa: E731
    mha = lambda h, kv, tp, cp, b, c, m: good_shortest(h, h, tp, cp, b, c, m)  # noqa: E731
    per_rank = lambda h, kv, tp, cp, b, c, m: good_shortest(h, kv, tp, cp, b, c, m) // cp  # noqa: E731
    at_peak = lambda h, kv, tp, cp, b, c, m: good_shortest(h, kv, tp, cp, b, c, 1.0)  # noqa: E731
    for wrong in (no_tp, mha, per_rank, at_peak):
        cases = O.ring_cases()
        if all(wrong(*c) == O.ring_answer(*c) for c in cases):
            continue  # this seed's cases do not tell this mistake apart
        with pytest.raises(AssertionError, match="✗ task 4: shortest_hidden_context"):
            C.check_ring_overlap(wrong)


def test_ring_overlap_refuses_the_course_estimate():
    def course(heads, kv_heads, tp, cp, link_GBps, causal, mfu):
        from course_lib.measure import estimate

        return cp * math.ceil(
            estimate.cp_ring_overlap_min_tokens(
                heads=heads, kv_heads=kv_heads, tp=tp, causal=causal, link_GBps=link_GBps,
                peak_flops=989e12 * mfu,
            )
        )  # fmt: skip

    with pytest.raises(AssertionError, match="✗ task 4: uses the course's own cp_ring"):
        C.check_ring_overlap(course)


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


def test_check_ring_block(seed):
    kit.check_table(
        C.check_ring_block,
        [
            (good_step, "✓ task 2: your ring step"),
            (buggy_step, "✗ task 2: 2 ranks: the output differs"),
            (course_step, "✗ task 2: uses the course's own"),
        ],
    )


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
