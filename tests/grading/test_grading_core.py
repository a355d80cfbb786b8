"""Verdict helpers: exact lines, ✗ messages that say expected vs got, chained tracebacks."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from course_lib.grading import check_close, check_equal, fail, fmt_int, passed, run_learner


def test_grading_package_does_not_import_torch():
    code = "import sys, course_lib.grading; print('torch' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "False"


def test_fmt_int_and_passed_line(capsys):
    assert fmt_int(3145728) == "3,145,728"
    assert fmt_int(-1024) == "-1,024"
    with pytest.raises(TypeError, match=r"n = 3.0: expected an int \(fmt_int formats integers\)"):
        fmt_int(3.0)
    passed(3, "bytes = 3,145,728")
    assert capsys.readouterr().out == "✓ task 3: bytes = 3,145,728\n"
    with pytest.raises(ValueError, match="single line"):
        passed(3, "two\nlines")


def test_fail_raises_the_cross_line():
    with pytest.raises(AssertionError) as info:
        fail(2, "expected 4, got 5")
    assert str(info.value) == "✗ task 2: expected 4, got 5"


def test_check_equal_ints_use_thousands_separators(capsys):
    check_equal(1, "bytes", 3145728, 3145728)
    assert capsys.readouterr().out == "✓ task 1: bytes = 3,145,728\n"
    with pytest.raises(
        AssertionError, match=r"^✗ task 1: bytes: expected 3,145,728, got 3,145,000$"
    ):
        check_equal(1, "bytes", 3145000, 3145728)
    with pytest.raises(AssertionError, match="expected 1, got True"):
        check_equal(1, "count", True, 1)
    check_equal(1, "count", torch.tensor(7), 7)  # a one-element tensor stands for its number
    assert capsys.readouterr().out == "✓ task 1: count = 7\n"


def test_check_equal_tensors(capsys):
    a = torch.arange(6).reshape(2, 3)
    check_equal(4, "ids", a.clone(), a)
    assert (
        capsys.readouterr().out
        == "✓ task 4: ids equals the reference (shape (2, 3), dtype torch.int64)\n"
    )
    b = a.clone()
    b[1, 2] = 0
    with pytest.raises(
        AssertionError,
        match=r"1 of 6 elements different \(first at index \(1, 2\): got 0, expected 5\)",
    ):
        check_equal(4, "ids", b, a)
    with pytest.raises(AssertionError, match="expected dtype torch.int64, got dtype torch.int32"):
        check_equal(4, "ids", a.int(), a)
    with pytest.raises(AssertionError, match=r"expected shape \(2, 3\), got shape \(3, 2\)"):
        check_equal(4, "ids", a.T.contiguous(), a)
    with pytest.raises(AssertionError, match="expected a tensor, got list"):
        check_equal(4, "ids", [0, 1], a)


def test_check_close_numbers_and_tensors(capsys):
    check_close(5, "loss", 1.0 + 1e-9, 1.0, rtol=1e-6, atol=0.0)
    assert (
        capsys.readouterr().out
        == "✓ task 5: loss matches the reference within rtol=1e-06, atol=0\n"
    )
    with pytest.raises(
        AssertionError,
        match=r"^✗ task 5: loss: expected 1, got 1.1 \(abs error 0.1, rtol=1e-06, atol=0\)$",
    ):
        check_close(5, "loss", 1.1, 1.0, rtol=1e-6, atol=0.0)

    ref = torch.linspace(-1, 1, 12).reshape(3, 4)
    check_close(6, "grad", ref + 1e-7, ref, rtol=0.0, atol=1e-6)
    assert (
        capsys.readouterr().out
        == "✓ task 6: grad (shape (3, 4)) matches the reference within rtol=0, atol=1e-06\n"
    )
    bad = ref.clone()
    bad[2, 1] += 0.5
    with pytest.raises(AssertionError) as info:
        check_close(6, "grad", bad, ref, rtol=0.0, atol=1e-6)
    message = str(info.value)
    assert message.startswith(
        "✗ task 6: grad: expected values close to the reference (rtol=0, atol=1e-06)"
    )
    assert "1 of 12 elements outside; max abs error 0.5 at index (2, 1)" in message
    with pytest.raises(
        AssertionError, match="expected dtype torch.float32, got dtype torch.float64"
    ):
        check_close(6, "grad", ref.double(), ref)
    check_close(6, "grad", ref.double(), ref, check_dtype=False)
    with pytest.raises(AssertionError, match=r"expected shape \(3, 4\), got shape \(4, 3\)"):
        check_close(6, "grad", ref.T, ref)
    nan = ref.clone()
    nan[0, 0] = float("nan")
    with pytest.raises(AssertionError, match="1 of 12 elements outside"):
        check_close(6, "grad", nan, ref)
    check_close(6, "grad", nan, nan.clone())  # NaN matches NaN at the same place
    with pytest.raises(AssertionError, match="got None"):
        check_close(6, "grad", None, ref)
    with pytest.raises(ValueError, match="rtol must be a non-negative number, got -1"):
        check_close(6, "grad", ref, ref, rtol=-1)


def test_run_learner_turns_errors_into_verdicts():
    def stub(x):
        raise NotImplementedError("FILL ME IN (roughly 2 lines)")

    def broken(x):
        return {}[x]

    assert run_learner(1, lambda x: x + 1, 1) == 2
    with pytest.raises(AssertionError) as info:
        run_learner(7, stub, 1)
    assert str(info.value) == "✗ task 7: not implemented yet: stub raised NotImplementedError"
    assert isinstance(info.value.__cause__, NotImplementedError)  # traceback stays chained
    with pytest.raises(AssertionError) as info:
        run_learner(7, broken, "key")
    assert str(info.value).endswith("broken raised KeyError: 'key'")
    assert isinstance(info.value.__cause__, KeyError)
    with pytest.raises(AssertionError, match="expected a function, got int 3"):
        run_learner(7, 3)


def test_expect_int_refuses_floats_and_bools_with_the_value():
    from course_lib.grading import expect_int

    assert expect_int(1, "bytes", 16) == 16
    import numpy as np

    assert expect_int(1, "bytes", np.int64(16)) == 16
    for bad in (16.0, True, "16", None):
        with pytest.raises(AssertionError, match=r"✗ task 1: bytes must be an int, got"):
            expect_int(1, "bytes", bad)


def test_a_verdict_renders_as_its_line_and_the_learners_own_frames_only():
    with pytest.raises(AssertionError) as info:
        fail(2, "expected 3, got 4")
    assert info.value._render_traceback_() == ["✗ task 2: expected 3, got 4"]

    def stub(x):
        raise NotImplementedError("FILL ME IN")

    with pytest.raises(AssertionError) as info:
        run_learner(1, stub, 1)
    assert info.value._render_traceback_() == [
        "✗ task 1: not implemented yet: stub raised NotImplementedError"
    ]

    def broken(x):
        return {}[x]

    with pytest.raises(AssertionError) as info:
        run_learner(3, broken, "key")
    shown = "".join(info.value._render_traceback_())
    assert "return {}[x]" in shown and "KeyError" in shown  # the learner's frame
    assert "course_lib" not in shown  # never the check's source
    assert shown.endswith("✗ task 3: broken raised KeyError: 'key'")
