"""The value checks of :mod:`course_lib.grading.core` (which re-exports them): ``check_close``
(torch.allclose's rule, any shape) and ``check_equal`` (exact). ``torch`` is imported only when a
tensor is checked.
"""

from __future__ import annotations

import math
import numbers
import sys
from typing import Any

from course_lib.grading.verdicts import (
    _check_message,
    _check_task,
    _fmt_value,
    fail,
    fmt_int,
    passed,
)


# --------------------------------------------------------------------------- comparisons
def _is_tensor(x: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def _is_number(x: Any) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _close_numbers(task: int, name: str, got: Any, expected: Any, rtol: float, atol: float) -> None:
    got_f, exp_f = float(got), float(expected)
    tol = f"rtol={rtol:g}, atol={atol:g}"
    if math.isnan(exp_f) and math.isnan(got_f):
        passed(task, f"{name} is nan as expected")
        return
    err = abs(got_f - exp_f)
    if math.isnan(got_f) or math.isnan(exp_f) or not err <= atol + rtol * abs(exp_f):
        fail(task, f"{name}: expected {exp_f:.6g}, got {got_f:.6g} (abs error {err:.3g}, {tol})")
    passed(task, f"{name} matches the reference within {tol}")


def check_close(
    task: int,
    name: str,
    got: Any,
    expected: Any,
    *,
    rtol: float = 1e-5,
    atol: float = 1e-8,
    check_dtype: bool = True,
) -> None:
    """Check ``|got - expected| <= atol + rtol * |expected|`` elementwise (torch.allclose's rule).

    ``got``/``expected`` are numbers, tensors, or anything ``torch.as_tensor`` accepts (lists,
    numpy arrays). Shapes must match; for two tensors the dtypes must match too unless
    ``check_dtype=False``. NaN matches NaN only at the same position. On success prints
    ``✓ task N: <name> matches the reference within rtol=..., atol=...`` (no measured error in
    the ✓ line: it must be identical on every machine); on failure the ✗ message gives the
    expected and got values, the max absolute error and where it is.
    """
    _check_task(task)
    _check_message(name)
    for pname, tol in (("rtol", rtol), ("atol", atol)):
        if not _is_number(tol) or not tol >= 0:
            raise ValueError(f"{pname} must be a non-negative number, got {tol!r}")
    if got is None:
        fail(task, f"{name}: expected a value, got None (did the function forget to return?)")

    if _is_number(got) and _is_number(expected):
        _close_numbers(task, name, got, expected, rtol, atol)
        return

    g, e = _as_tensors(task, name, got, expected, check_dtype)
    import torch  # only now: check_close on tensors

    g64 = g.detach().to(
        "cpu", torch.float64
    )  # compare in float64: the rule, not the dtype, decides
    e64 = e.detach().to("cpu", torch.float64)
    tolerance = f"rtol={rtol:g}, atol={atol:g}"
    both_nan = torch.isnan(g64) & torch.isnan(e64)
    err = (g64 - e64).abs().masked_fill(both_nan, 0.0)
    bad = ~(err <= atol + rtol * e64.abs()) & ~both_nan  # NaN error counts as bad
    if bool(bad.any()):
        _fail_not_close(task, name, g64, e64, err, bad, tolerance)
    shape = f" (shape {tuple(e.shape)})" if e.dim() else ""
    passed(task, f"{name}{shape} matches the reference within {tolerance}")


def _as_tensors(
    task: int, name: str, got: Any, expected: Any, check_dtype: bool
) -> tuple[Any, Any]:
    """``got`` and ``expected`` as tensors of one shape (and dtype, when asked), or a ✗ verdict."""
    import torch

    def as_tensor(x: Any) -> torch.Tensor:
        if isinstance(x, torch.Tensor):
            return x
        try:
            return torch.as_tensor(x)
        except (TypeError, ValueError, RuntimeError):
            fail(task, f"{name}: expected a tensor or number, got {type(x).__name__}")

    if check_dtype and isinstance(expected, torch.Tensor) and not isinstance(got, torch.Tensor):
        fail(task, f"{name}: expected a tensor, got {type(got).__name__}")
    g, e = as_tensor(got), as_tensor(expected)
    if tuple(g.shape) != tuple(e.shape):
        fail(task, f"{name}: expected shape {tuple(e.shape)}, got shape {tuple(g.shape)}")
    if check_dtype and isinstance(got, torch.Tensor) and isinstance(expected, torch.Tensor):
        if got.dtype != expected.dtype:
            fail(task, f"{name}: expected dtype {expected.dtype}, got dtype {got.dtype}")
    if g.is_complex() or e.is_complex():
        which, t = ("got", g) if g.is_complex() else ("expected", e)
        raise TypeError(
            f"{which} = a {t.dtype} tensor ({name}): expected real values (check_close does not "
            "compare complex tensors)"
        )
    return g, e


def _fail_not_close(task: int, name: str, g64: Any, e64: Any, err: Any, bad: Any, tol: str) -> None:
    """The ✗ verdict of check_close: how many elements are outside, the worst one and where."""
    import torch

    n_bad = int(bad.sum())
    finite_err = err.masked_fill(torch.isnan(err), math.inf)
    flat = int(torch.argmax(finite_err.masked_fill(~bad, -1.0)).item()) if e64.dim() else 0
    idx = (
        tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), e64.shape))
        if e64.dim()
        else ()
    )
    max_err = float(finite_err[bad].max())
    where = f" at index {idx}" if e64.dim() else ""
    fail(
        task,
        f"{name}: expected values close to the reference ({tol}), got {fmt_int(n_bad)} of "
        f"{fmt_int(e64.numel())} elements outside; max abs error {max_err:.3g}{where} "
        f"(got {float(g64.reshape(-1)[flat]):.6g}, expected {float(e64.reshape(-1)[flat]):.6g})",
    )


def check_equal(task: int, name: str, got: Any, expected: Any) -> None:
    """Check ``got == expected`` exactly (ints, strings, tuples, dicts, tensors...).

    Prints ``✓ task N: <name> = <expected>`` (ints with thousands separators) or, for tensors,
    ``✓ task N: <name> equals the reference (shape ..., dtype ...)``. A one-element tensor is
    accepted where a plain number is expected.
    """
    _check_task(task)
    _check_message(name)
    if _is_tensor(expected):
        import torch

        if not isinstance(got, torch.Tensor):
            fail(task, f"{name}: expected a tensor, got {type(got).__name__}")
        if tuple(got.shape) != tuple(expected.shape):
            fail(
                task,
                f"{name}: expected shape {tuple(expected.shape)}, got shape {tuple(got.shape)}",
            )
        if got.dtype != expected.dtype:
            fail(task, f"{name}: expected dtype {expected.dtype}, got dtype {got.dtype}")
        differ = got.detach().cpu() != expected.detach().cpu()
        if bool(differ.any()):
            first = tuple(int(i) for i in differ.nonzero()[0]) if differ.dim() else ()
            fail(
                task,
                f"{name}: expected the reference tensor, got {fmt_int(int(differ.sum()))} of "
                f"{fmt_int(expected.numel())} elements different (first at index {first}: got "
                f"{got.detach().cpu()[first].item()!r}, expected {expected.detach().cpu()[first].item()!r})",
            )
        passed(
            task,
            f"{name} equals the reference (shape {tuple(expected.shape)}, dtype {expected.dtype})",
        )
        return

    if _is_tensor(got):
        if got.numel() != 1:
            fail(
                task,
                f"{name}: expected {_fmt_value(expected)}, got a tensor of shape {tuple(got.shape)}",
            )
        got = got.item()
    try:
        same = bool(got == expected)
    except Exception:  # noqa: BLE001 - e.g. ambiguous truth value of an array
        same = False
    if same and type(got) is bool and type(expected) is not bool:
        same = False  # True == 1 in Python; a bool is not the count we asked for
    if not same:
        fail(task, f"{name}: expected {_fmt_value(expected)}, got {_fmt_value(got)}")
    passed(task, f"{name} = {_fmt_value(expected)}")
