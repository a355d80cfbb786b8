"""Unit 17's graded checks: a right answer passes, a wrong one fails, the course's own is refused."""

from __future__ import annotations

import pytest
import torch
from _grading_seeds import FIXTURE_SEEDS  # seed 0: tests/_grading_seeds.py

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


def test_rowwise(seed, capsys):
    C.check_rowwise(rowwise_right)
    assert capsys.readouterr().out.startswith("✓ task 1: rowwise E4M3")
    with pytest.raises(AssertionError, match="✗ task 1: outliers: expected one scale per row"):
        C.check_rowwise(rowwise_tensorwise)
    with pytest.raises(AssertionError, match="✗ task 1: outliers: data . scale has inf or NaN"):
        C.check_rowwise(rowwise_zero_row_nan)
    with pytest.raises(AssertionError, match="✗ task 1: uses the course's own"):
        C.check_rowwise(rowwise_course)
    with pytest.raises(AssertionError, match="✗ task 1: data: expected a torch.float8_e4m3fn"):
        C.check_rowwise(lambda x: (x, x.abs().amax(1) / 448))


def cast_buggy(x):
    scale = x.abs().max().clamp_min(1e-12) / 448.0
    data = x.to(torch.float8_e4m3fn)  # the bug: cast first
    return (data.float() / scale).clamp(-448, 448).to(torch.float8_e4m3fn), scale


def cast_fixed(x):
    scale = x.abs().max().clamp_min(1e-12) / 448.0
    return (x / scale).clamp(-448, 448).to(torch.float8_e4m3fn), scale


def test_fixed_cast(seed, capsys):
    C.check_fixed_cast(cast_fixed)
    assert capsys.readouterr().out.startswith("✓ task 2: scale first")
    with pytest.raises(AssertionError, match="✗ task 2: values up to 5000: "):
        C.check_fixed_cast(cast_buggy)
    with pytest.raises(AssertionError, match="✗ task 2: uses the course's own"):
        C.check_fixed_cast(_course_tensorwise)


def _course_tensorwise(x):
    from course_lib.techniques.fp8 import to_float8

    q = to_float8(x)
    return q.data, q.scale


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
    for check in (C.check_rowwise, C.check_fixed_cast, C.check_fsdp_fp8):
        with pytest.raises(AssertionError, match=rf"✗ task {check.task}: "):
            check.run_judge(junk)
