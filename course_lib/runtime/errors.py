"""The one exception a multi-rank run raises: which ranks failed, and how.

Introduced in notebooks/00_start_here.ipynb; raised by :func:`course_lib.launch`.
"""

from __future__ import annotations


class LaunchError(RuntimeError):
    """One or more ranks of a :func:`course_lib.launch` run failed, died or timed out.

    Attributes:
        failures: rank -> what went wrong on that rank (exception type, message and
            traceback; or the signal that killed it; or "still running at the deadline").
            Only ranks that did not return normally appear here.
        summary: one line per rank, in rank order, saying how every rank ended
            (including ranks that returned normally or were stopped by the launcher).
    """

    def __init__(
        self, message: str, failures: dict[int, str], summary: dict[int, str] | None = None
    ):
        super().__init__(message)
        self.failures = dict(sorted(failures.items()))
        self.summary = dict(sorted((summary or {}).items()))

    def __reduce__(self) -> tuple[type[LaunchError], tuple[str, dict[int, str], dict[int, str]]]:
        # keep the attributes when the error crosses a process boundary (pickle)
        return type(self), (self.args[0], self.failures, self.summary)
