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

import numbers
from typing import Any, Callable, Iterable, NoReturn

from course_lib.grading.values import (  # noqa: F401 (re-exported)
    check_close,
    check_equal,
)
from course_lib.grading.verdicts import (  # noqa: F401 (re-exported)
    _check_message,
    _check_task,
    _fmt_value,
    _one_line,
    fail,
    fmt_int,
    passed,
    verdict,
)

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


def expect_int(task: int, what: str, got: Any) -> int:
    """``got`` if it is an int (bytes, counts: the tasks say int); otherwise the ✗ verdict
    ``✗ task N: <what> must be an int, got float 16.0`` (a float equal to the answer included:
    a float of bytes is a sign the arithmetic went through a division)."""
    if isinstance(got, bool) or not isinstance(got, numbers.Integral):
        from course_lib.grading.plain import describe

        fail(task, f"{what} must be an int, got {describe(got)}")
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
    task: int, worker: Callable[..., dict[Any, Any]], world_size: int, *args: Any, timeout: float
) -> list[dict[Any, Any]]:
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
