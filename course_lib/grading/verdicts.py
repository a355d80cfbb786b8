"""The verdict lines of :mod:`course_lib.grading.core` (which re-exports them): ``passed`` prints
``✓ task N: ...``, ``fail`` raises ``AssertionError("✗ task N: ...")``, with deterministic number
formatting.
"""

from __future__ import annotations

import numbers
from typing import Any, NoReturn

#: frames of the course's own code, left out of the traceback a verdict shows
_COURSE_DIR = __file__.rsplit("/grading/", 1)[0]


# --------------------------------------------------------------------------- formatting
def fmt_int(n: int) -> str:
    """Format an integer with thousands separators: ``fmt_int(3145728) == "3,145,728"``."""
    if isinstance(n, bool) or not isinstance(n, numbers.Integral):
        raise TypeError(f"n = {n!r}: expected an int (fmt_int formats integers)")
    return f"{int(n):,}"


def _fmt_value(value: Any) -> str:
    """Deterministic short text for a value inside a verdict line."""
    if isinstance(value, bool):
        return repr(value)
    if isinstance(value, numbers.Integral):
        return fmt_int(int(value))
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
# (task, line) of every ✓ printed in this process: the grade's clean process reads its task's
recorded: list[tuple[int, str]] = []


def passed(task: int, message: str) -> None:
    """Print the one deterministic success line ``✓ task N: <message>``."""
    _check_task(task)
    line = f"✓ task {task}: {_check_message(message)}"
    recorded.append((task, line))
    print(line)


def fail(task: int, message: str) -> NoReturn:
    """Raise ``AssertionError("✗ task N: <message>")``; message says expected vs got."""
    _check_task(task)
    if not isinstance(message, str):
        raise TypeError(f"message must be a str, got {type(message).__name__} {message!r}")
    raise verdict(f"✗ task {task}: {message}")


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
    # IPython shows what this hook returns in place of the traceback
    exc.__dict__["_render_traceback_"] = lambda: [*lines, line]
    return exc
