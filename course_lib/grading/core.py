"""Verdict helpers shared by every unit's checks (``course_lib.units.uNN_topic.checks``).

A graded check cell calls one check; the check prints exactly one deterministic line

    ✓ task 3: grad_w matches the reference within rtol=1e-05, atol=1e-08

or raises ``AssertionError("✗ task 3: ...")``. The ✓ line is compared, byte for byte after
sanitising, against the expected output stored in ``solutions/`` (by nbval and by
``python -m course_lib.grade``), so it must never contain timings, addresses, floating-point
noise or anything else that depends on the machine. Failure messages may (and should) show the
numbers that differ: they are read by the learner, never compared.

This module imports nothing heavy: ``torch`` is imported only when a tensor is checked.
Used by the check cells of every exercises/NN_topic.ipynb.
"""

from __future__ import annotations

import math
import numbers
import sys
from typing import Any, Callable, Iterable, NoReturn

__all__ = [
    "check_close",
    "check_equal",
    "expect_int",
    "fail",
    "error_pair",
    "fmt_int",
    "launch_learner",
    "passed",
    "refuse",
    "run_learner",
]


# --------------------------------------------------------------------------- formatting
def fmt_int(n: int) -> str:
    """Format an integer with thousands separators: ``fmt_int(3145728) == "3,145,728"``."""
    if isinstance(n, bool) or not isinstance(n, numbers.Integral):
        raise TypeError(f"fmt_int: n must be an int, got {type(n).__name__} {n!r}")
    return f"{int(n):,}"


def _fmt_value(value: Any) -> str:
    """Deterministic short text for a value inside a verdict line."""
    if isinstance(value, bool):
        return repr(value)
    if isinstance(value, numbers.Integral):
        return fmt_int(value)
    if isinstance(value, float):
        return f"{value:.6g}"
    return repr(value)


def _one_line(text: str) -> str:
    lines = str(text).strip().splitlines()
    return lines[0] if lines else ""


def _check_task(task: Any) -> None:
    if isinstance(task, bool) or not isinstance(task, (int, str)) or str(task).strip() == "":
        raise TypeError(f"task must be a task number (int), got {type(task).__name__} {task!r}")


def _check_message(message: Any) -> str:
    if not isinstance(message, str):
        raise TypeError(f"message must be a str, got {type(message).__name__} {message!r}")
    if "\n" in message or "\r" in message:
        raise ValueError(
            f"message must be a single line (it is compared as one line), got {message!r}"
        )
    return message


# --------------------------------------------------------------------------- verdicts
def passed(task: int, message: str) -> None:
    """Print the one deterministic success line ``✓ task N: <message>``."""
    _check_task(task)
    print(f"✓ task {task}: {_check_message(message)}")


def fail(task: int, message: str) -> NoReturn:
    """Raise ``AssertionError("✗ task N: <message>")``; message says expected vs got."""
    _check_task(task)
    if not isinstance(message, str):
        raise TypeError(f"message must be a str, got {type(message).__name__} {message!r}")
    raise verdict(f"✗ task {task}: {message}")


_COURSE_DIR = __file__.rsplit("/grading/", 1)[0]


def verdict(line: str, cause: BaseException | None = None) -> AssertionError:
    """The ``AssertionError`` of a ✗ verdict, shown in a notebook as that one line.

    IPython renders an exception through its ``_render_traceback_`` when it has one: here the ✗
    line alone, so a failed check never prints the check's source (which would show the answer).
    When the learner's own code raised (``cause``), its frames come first: the learner's
    traceback is useful, the course's is not. nbval and the grader still see an error with
    ``ename`` AssertionError and the ✗ line as ``evalue``.
    """
    exc = AssertionError(line)
    lines = []
    if cause is not None and not isinstance(cause, NotImplementedError):
        import traceback

        frames = [
            f
            for f in traceback.extract_tb(cause.__traceback__)
            if not f.filename.startswith(_COURSE_DIR)
        ]
        if frames:
            lines = [
                "Traceback of your code (most recent call last):",
                *traceback.format_list(frames),
                f"{type(cause).__name__}: {cause}",
                "",
            ]
    exc._render_traceback_ = lambda: [*lines, line]
    return exc


def expect_int(task: int, what: str, got: Any) -> int:
    """``got`` if it is an int (bytes, counts: the tasks say int); otherwise the ✗ verdict
    ``✗ task N: <what> must be an int, got float 16.0`` (a float equal to the answer included:
    a float of bytes is a sign the arithmetic went through a division)."""
    if isinstance(got, bool) or not isinstance(got, numbers.Integral):
        fail(task, f"{what} must be an int, got {type(got).__name__} {got!r}")
    return int(got)


def _callable_name(fn: Any) -> str:
    qualname = getattr(fn, "__qualname__", None)
    if isinstance(qualname, str) and "<locals>" not in qualname:
        return qualname  # e.g. "Block.forward"
    return getattr(fn, "__name__", None) or type(fn).__name__


def run_learner(
    task: int, fn: Callable[..., Any], *args: Any, forbid: Iterable[str] = (), **kwargs: Any
) -> Any:
    """Call the learner's ``fn(*args, **kwargs)`` and turn its failures into ✗ verdicts.

    ``NotImplementedError`` (the untouched exercise stub) becomes
    ``✗ task N: not implemented yet: <fn> raised NotImplementedError``; any other exception becomes
    ``✗ task N: <fn> raised <Type>: <first line of its message>``. The original exception is
    chained (``raise ... from exc``) so its traceback stays visible below the verdict.

    ``forbid`` names the course's own answers to this task as ``"module:qualname"`` strings; if the
    call enters one of them, the verdict is ``✗ task N: uses the course's own <name>: write it
    yourself`` (see :mod:`course_lib.grading.references`).
    """
    _check_task(task)
    if not callable(fn):
        fail(task, f"expected a function, got {type(fn).__name__} {fn!r}")
    name = _callable_name(fn)
    forbid = [forbid] if isinstance(forbid, str) else list(forbid)
    if forbid:
        from course_lib.grading.references import watch_references
    try:
        if not forbid:
            return fn(*args, **kwargs)
        with watch_references(forbid) as used:
            try:
                result = fn(*args, **kwargs)
            finally:
                if used:
                    refuse(task, used)
        return result
    except NotImplementedError as exc:
        raise verdict(
            f"✗ task {task}: not implemented yet: {name} raised NotImplementedError", exc
        ) from exc
    except AssertionError as exc:
        if str(exc).startswith(f"✗ task {task}: uses the course's own"):
            raise exc from None
        raise _learner_error(task, name, exc) from exc
    except Exception as exc:  # noqa: BLE001 - every learner error becomes a verdict
        raise _learner_error(task, name, exc) from exc


def refuse(task: int, used: Iterable[str]) -> NoReturn:
    """The verdict for a learner's function that called the course's own answer."""
    names = ", ".join(used)
    fail(task, f"uses the course's own {names}: write it yourself")


def error_pair(exc: BaseException) -> tuple[str, str]:
    """(type name, first line of the message): how a rank reports the learner's exception back."""
    return type(exc).__name__, (str(exc).strip().splitlines() or [""])[0]


def launch_learner(
    task: int, worker: Callable[..., dict], world_size: int, *args: Any, timeout: float
) -> list[dict]:
    """Run ``worker`` on ``world_size`` real ranks for a check; every rank's result dict.

    A rank's worker reports ``{"used": [...]}`` when the learner's code called the course's own
    answer and ``{"error": error_pair(exc)}`` when it raised; either fails the task with one line,
    as does a run that does not finish within ``timeout`` seconds. ``launch`` is imported here,
    not at module level, so a check cell that never launches stays light.
    """
    from course_lib.runtime.errors import LaunchError
    from course_lib.runtime.launch import launch

    try:
        results = launch(worker, world_size, *args, timeout=timeout)
    except LaunchError as exc:
        first = next(iter(exc.failures.values()), str(exc))
        fail(
            task,
            f"the run on {world_size} ranks did not finish: "
            f"{(str(first).strip().splitlines() or [''])[0]}",
        )
    for rank, res in enumerate(results):
        if res.get("used"):
            refuse(task, res["used"])
        if res.get("error"):
            kind, message = res["error"]
            if kind == "NotImplementedError":
                fail(task, "not implemented yet: your function raised NotImplementedError")
            fail(task, f"raised {kind} on rank {rank} of {world_size}: {message}")
    return results


def _learner_error(task: int, name: str, exc: BaseException) -> AssertionError:
    detail = _one_line(str(exc))
    kind = type(exc).__name__
    return verdict(
        f"✗ task {task}: {name} raised {kind}: {detail}"
        if detail
        else f"✗ task {task}: {name} raised {kind}",
        exc,
    )


# --------------------------------------------------------------------------- comparisons
def _is_tensor(x: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def _is_number(x: Any) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _close_numbers(task, name, got, expected, rtol, atol) -> None:
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

    import torch  # only now: check_close on tensors

    def as_tensor(x: Any, which: str) -> torch.Tensor:
        if isinstance(x, torch.Tensor):
            return x
        try:
            return torch.as_tensor(x)
        except (TypeError, ValueError, RuntimeError):
            fail(task, f"{name}: expected a tensor or number, got {type(x).__name__}")

    if check_dtype and isinstance(expected, torch.Tensor) and not isinstance(got, torch.Tensor):
        fail(task, f"{name}: expected a tensor, got {type(got).__name__}")
    g, e = as_tensor(got, "got"), as_tensor(expected, "expected")
    if tuple(g.shape) != tuple(e.shape):
        fail(task, f"{name}: expected shape {tuple(e.shape)}, got shape {tuple(g.shape)}")
    if check_dtype and isinstance(got, torch.Tensor) and isinstance(expected, torch.Tensor):
        if got.dtype != expected.dtype:
            fail(task, f"{name}: expected dtype {expected.dtype}, got dtype {got.dtype}")
    if g.is_complex() or e.is_complex():
        raise TypeError(f"check_close: complex tensors are not supported (parameter {name!r})")
    g64 = g.detach().to(
        "cpu", torch.float64
    )  # compare in float64: the rule, not the dtype, decides
    e64 = e.detach().to("cpu", torch.float64)
    tol = f"rtol={rtol:g}, atol={atol:g}"
    both_nan = torch.isnan(g64) & torch.isnan(e64)
    err = (g64 - e64).abs().masked_fill(both_nan, 0.0)
    bad = ~(err <= atol + rtol * e64.abs()) & ~both_nan  # NaN error counts as bad
    shape = f" (shape {tuple(e.shape)})" if e.dim() else ""
    if bool(bad.any()):
        n_bad = int(bad.sum())
        finite_err = err.masked_fill(torch.isnan(err), math.inf)
        flat = int(torch.argmax(finite_err.masked_fill(~bad, -1.0)).item()) if e.dim() else 0
        idx = (
            tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), e.shape))
            if e.dim()
            else ()
        )
        max_err = float(finite_err[bad].max())
        where = f" at index {idx}" if e.dim() else ""
        fail(
            task,
            f"{name}: expected values close to the reference ({tol}), got {fmt_int(n_bad)} of "
            f"{fmt_int(e.numel())} elements outside; max abs error {max_err:.3g}{where} "
            f"(got {float(g64.reshape(-1)[flat]):.6g}, expected {float(e64.reshape(-1)[flat]):.6g})",
        )
    passed(task, f"{name}{shape} matches the reference within {tol}")


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
