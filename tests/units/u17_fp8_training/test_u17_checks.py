"""Unit 17's graded checks: a right answer passes, a wrong one fails, the course's own is refused."""

from __future__ import annotations

import pytest
import torch
from _grading_seeds import FIXTURE_SEEDS  # seed 0: tests/_grading_seeds.py

from course_lib import kit
from course_lib.units.u17_fp8_training import checks as C


def rowwise_right(x):
    amax = x.abs().amax(dim=1, keepdim=True)
    scale = amax.clamp_min(1e-12) / 448.0
    return (x / scale).clamp(-448, 448).to(torch.float8_e4m3fn), scale


def rowwise_tensorwise(x):  # one scale for everyone: wrong count
    scale = x.abs().max() / 448.0
    return (x / scale).to(torch.float8_e4m3fn), scale.reshape(1)


def rowwise_zero_row_nan(x):  # divides 0 by 0 on the all-zero row
    scale = x.abs().amax(dim=1, keepdim=True) / 448.0
    return (x / scale).to(torch.float8_e4m3fn), scale


def rowwise_course(x):
    from course_lib.techniques.fp8 import to_float8

    q = to_float8(x, scaling="rowwise")
    return q.data, q.scale


@pytest.fixture(params=FIXTURE_SEEDS)
def seed(request, monkeypatch):
    monkeypatch.setenv("COURSE_GRADE_SEED", request.param)
    return request.param


def rowwise_not_cast(x):
    return x, x.abs().amax(1) / 448


def test_rowwise(seed):
    kit.check_table(
        C.check_rowwise,
        [
            (rowwise_right, "✓ task 1: rowwise E4M3"),
            (rowwise_tensorwise, "✗ task 1: outliers: expected one scale per row"),
            (rowwise_zero_row_nan, "✗ task 1: outliers: data . scale has inf or NaN"),
            (rowwise_course, "✗ task 1: uses the course's own"),
            (rowwise_not_cast, "✗ task 1: data: expected a torch.float8_e4m3fn"),
        ],
    )


def grad_cast_buggy(g):  # the exercise's bug: E4M3's 448 in an E5M2 cast
    scale = g.abs().max().clamp_min(1e-12) / 448.0
    return (g / scale).clamp(-448, 448).to(torch.float8_e5m2), scale


def grad_cast_right(g):
    scale = g.abs().max().clamp_min(1e-12) / 57344.0
    return (g / scale).clamp(-57344, 57344).to(torch.float8_e5m2), scale


def grad_cast_e4m3(g):  # the right scale for E4M3, the wrong format for the check
    scale = g.abs().max().clamp_min(1e-12) / 448.0
    return (g / scale).to(torch.float8_e4m3fn), scale


def grad_cast_cast_first(g):  # casts before scaling: the gradients flush before the scale helps
    scale = g.abs().max().clamp_min(1e-12) / 57344.0
    return (g.to(torch.float8_e5m2).float() / scale).clamp(-57344, 57344).to(
        torch.float8_e5m2
    ), scale


def test_grad_cast(seed, capsys):
    C.check_grad_cast(grad_cast_right)
    line = capsys.readouterr().out
    assert line.startswith("✓ task 2: your gradient cast keeps")
    assert "57" not in line and "448" not in line  # the ✓ line gives no answer away
    with pytest.raises(AssertionError, match="✗ task 2: gradient: \\d+ of 8192 nonzero values"):
        C.check_grad_cast(grad_cast_buggy)
    with pytest.raises(AssertionError, match="✗ task 2: data: expected a torch.float8_e5m2"):
        C.check_grad_cast(grad_cast_e4m3)
    with pytest.raises(AssertionError, match="✗ task 2: gradient: "):
        C.check_grad_cast(grad_cast_cast_first)
    with pytest.raises(AssertionError, match="✗ task 2: uses the course's own"):
        C.check_grad_cast(_course_e5m2)


def _course_e5m2(g):
    from course_lib.techniques.fp8 import to_float8

    q = to_float8(g, dtype="e5m2")
    return q.data, q.scale


def fp8_overlap_right(world_size, link_GBps):
    n, b = world_size, link_GBps * 1e9
    bf16 = 989e12 / b * (n - 1) / n * 2 / 2  # forward and backward bind equally in bf16
    fp8 = 1979e12 / b * (n - 1) / n * (1 + 2) / 4  # backward binds
    return bf16, fp8


def test_fp8_overlap(seed, capsys):
    C.check_fp8_overlap(fp8_overlap_right)
    assert capsys.readouterr().out.startswith("✓ task 4: FSDP's hiding threshold")
    # hand-derived: 8 H100s over one 50 GB/s port, bf16: 19,780 x 7/8 = 17,307.5 tokens; FP8:
    # 39,580 x 7/8 x 3/4 = 25,974.375
    from course_lib.units.u17_fp8_training.checks_overlap import overlap_answer

    assert overlap_answer(8, 50.0) == pytest.approx((17307.5, 25974.375), rel=1e-12)
    same_flops = lambda n, b: (fp8_overlap_right(n, b)[0], fp8_overlap_right(n, b)[1] / 2)  # noqa: E731
    forward_only = lambda n, b: (fp8_overlap_right(n, b)[0], 1979e12 / (b * 1e9) * (n - 1) / n / 2)  # noqa: E731
    for wrong in (same_flops, forward_only):
        with pytest.raises(AssertionError, match="✗ task 4: fp8_overlap\\("):
            C.check_fp8_overlap(wrong)


def fsdp_right(n):
    h, f, L, V = 5120, 13824, 40, 32000
    linear = 4 * h * h + 3 * h * f
    other = 2 * V * h + (2 * L + 1) * h
    sent = 2 * (n - 1) * (L * linear + 2 * other) // n
    mem = 16 * (L * linear + other) // n + linear
    return sent, mem


def fsdp_all_bf16(n):  # forgot that the linear weights travel in FP8
    s, m = fsdp_right(n)
    h, f, L = 5120, 13824, 40
    return s + 2 * (n - 1) * L * (4 * h * h + 3 * h * f) // n, m


def fsdp_course(n):
    from course_lib.measure import estimate

    c = estimate.transformer_param_count(
        layers=40, hidden=5120, heads=40, kv_heads=40, ffn=13824, vocab=32000
    )
    return int(c["total"]), 0


def test_fsdp_fp8(seed, capsys):
    C.check_fsdp_fp8(fsdp_right)
    assert capsys.readouterr().out.startswith("✓ task 3: Llama-2-13B")
    first = C.fsdp_sizes(3)[0]
    with pytest.raises(
        AssertionError,
        match=rf"✗ task 3: fsdp_fp8_step.{first}. all-gather bytes: you gave .*, more than",
    ):
        C.check_fsdp_fp8(fsdp_all_bf16)
    with pytest.raises(AssertionError, match="✗ task 3: .* must be an int, got float"):
        C.check_fsdp_fp8(lambda n: tuple(float(v) for v in fsdp_right(n)))
    with pytest.raises(AssertionError, match="✗ task 3: uses the course's own"):
        C.check_fsdp_fp8(fsdp_course)


def test_llama2_13b_count_matches_estimate():
    from course_lib.measure import estimate

    c = estimate.transformer_param_count(
        layers=40, hidden=5120, heads=40, kv_heads=40, ffn=13824, vocab=32000
    )
    assert c["total"] == 13_015_864_320  # the released checkpoint's count


def test_copied_fsdp_answers_fail_under_another_seed(monkeypatch):
    table = {n: fsdp_right(n) for n in C.fsdp_sizes(3)}  # seed 0's, built here
    C.check_fsdp_fp8(lambda n: table.get(n, (0, 0)))
    monkeypatch.setenv("COURSE_GRADE_SEED", "7")
    assert C.fsdp_sizes(3) != sorted(table)
    with pytest.raises(AssertionError, match="✗ task 3: fsdp_fp8_step"):
        C.check_fsdp_fp8(lambda n: table.get(n, (0, 0)))


@pytest.mark.parametrize(
    "junk", [None, {}, [], [None] * 3, [(torch.zeros(2, 2, dtype=torch.float8_e4m3fn), 1.0)] * 3]
)
def test_judges_refuse_malformed_data(junk):
    # the judge half trusts nothing the learner's side hands back: a ✗, never a ✓ or a crash
    for check in (C.check_rowwise, C.check_grad_cast, C.check_fsdp_fp8, C.check_fp8_overlap):
        with pytest.raises(AssertionError, match=rf"✗ task {check.task}: "):
            check.run_judge(junk)
