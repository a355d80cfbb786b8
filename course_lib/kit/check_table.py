"""The test table of a graded check: each answer beside the line the check must print for it.

A unit's check tests (tests/units/uNN_*/test_*checks*.py) run one check on a right answer, on
wrong ones and on one that calls the course's own code, and compare what the check says::

    kit.check_table(
        C.check_dispatch,
        [
            (good_plan, "✓ task 1: your dispatch plan is right"),
            (swapped_plan, r"✗ task 1: case \\d+ .*input_splits"),
            (course_plan, "✗ task 1: uses the course's own"),
        ],
        task=1,
    )

A pattern that starts with ✓ must be found (``re.search``) in what the check prints and the check
must not raise; one that starts with ✗ must be found in the AssertionError the check raises.
"""

from __future__ import annotations

import contextlib
import io
import re
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["check_table"]

PASS, FAIL = "✓", "✗"


def _run(check: Callable[..., object], answer: object, kwargs: dict[str, Any]) -> tuple[str, str]:
    """(what the check printed, the message of the AssertionError it raised, or "")."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            check(answer, **kwargs)
        except AssertionError as e:
            return out.getvalue(), str(e)
    return out.getvalue(), ""


def check_table(
    check: Callable[..., object], table: Iterable[tuple[object, str]], **kwargs: Any
) -> list[str]:
    """Run ``check(answer, **kwargs)`` for each ``(answer, pattern)`` row; return what it said.

    Raises AssertionError naming the row (its answer's name) whose outcome differs: a ✓ row that
    failed or printed no matching line, a ✗ row that passed or failed with another message.
    """
    said = []
    for i, (answer, pattern) in enumerate(table):
        if not pattern.startswith((PASS, FAIL)):
            raise ValueError(f"table[{i}] pattern = {pattern!r}: expected to start with ✓ or ✗")
        name = getattr(answer, "__name__", repr(answer))
        printed, failed = _run(check, answer, kwargs)
        if pattern.startswith(PASS):
            if failed or not re.search(pattern, printed):
                raise AssertionError(
                    f"table[{i}] ({name}): expected {pattern!r}; the check printed {printed!r}"
                    + (f" and failed: {failed}" if failed else "")
                )
            said.append(printed.strip())
        else:
            if not re.search(pattern, failed):
                got = f"failed with {failed!r}" if failed else f"passed, printing {printed!r}"
                raise AssertionError(f"table[{i}] ({name}): expected {pattern!r}; the check {got}")
            said.append(failed)
    return said
