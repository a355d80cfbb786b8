"""A function's own argument checks without its work: :func:`check_arguments` runs a function
until its first :func:`course_lib.launch`, which checks its own arguments and stops there: no
process starts, no process group forms.

The course's functions check every argument before they launch ("checked in the caller before
any process starts", CONTRIBUTING), so a ValueError or TypeError that comes out is a bad argument,
in the repo's one-line shape; what the ranks would have done is not run. ``python -m
course_lib.cluster export`` and an exported script refuse a bad setting this way, by the unit's
own rules (a negative ``bucket_cap_mb``, a ``kill_rank`` past the world size), before anything
is written or started.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

__all__ = ["check_arguments", "stop_if_checking"]


class _Checked(BaseException):  # not an Exception: a unit's own ``except Exception`` lets it by
    """Raised by launch while :func:`check_arguments` runs: every check up to it passed."""


_state = threading.local()


def stop_if_checking() -> None:
    """Called by launch once its arguments are checked: stop here if only checks are wanted."""
    if getattr(_state, "checking", False):
        raise _Checked


def check_arguments(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    """Run ``fn(*args, **kwargs)`` up to its first launch and no further; what ``fn`` raises
    before it (its argument checks) comes out unchanged."""
    before = getattr(_state, "checking", False)
    _state.checking = True
    try:
        fn(*args, **kwargs)
    except _Checked:
        pass
    finally:
        _state.checking = before
