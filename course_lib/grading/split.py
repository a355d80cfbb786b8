"""A graded check in two halves: the learner's side (collect) and the judge's side (judge).

    def collect_count(count_parameters, task: int = 1):
        ...                       # call the learner's code on the seeded cases; no reference here
        return {"counts": counts}  # plain data (course_lib.grading.plain)

    def judge_count(data, task: int = 1) -> None:
        ...                       # draw the same cases, compute what is expected with the
        passed(task, "...")       # course's reference, compare: fail(...) or passed(...)

    check_count_parameters = split_check(collect_count, judge_count)

The check cell still reads ``unit.checks.check_count_parameters(count_parameters)``:

- in the learner's kernel (the self-check, nbval) the call runs both halves in-process, the data
  passed through :func:`course_lib.grading.plain.roundtrip` so that the self-check sees exactly
  what the judge will;
- in the grade command, ``collect`` runs inside the notebook's sandbox, where the course's answers
  to the unit's tasks are absent; what it returns crosses as plain data; ``judge`` runs outside,
  in a process that never imports or unpickles anything the learner wrote, and its ✓ line is the
  verdict.

Rules for the halves (what makes the wall hold):

- ``collect`` calls the learner's code and measures what that code does (outputs, the state it
  changed in place, bytes it sent, calls it made), and nothing else: it never computes what is
  expected, never calls a course reference the task forbids (those are stubs in the sandbox),
  never decides pass or fail. A learner's error becomes a ✗ verdict through ``run_learner`` or
  ``fail`` as before; in the grade command that verdict crosses as data and fails the task.
- ``judge`` draws the cases again from the same seed, computes the expected values with the
  course's reference code, and compares. It trusts nothing in ``data``: a missing key, a wrong
  type or shape is a ✗ line (:func:`need`, :func:`need_list`), never a crash that could be
  read as a pass.
- ``prepare`` (optional) computes, on the judge's side and before the sandbox starts, inputs that
  need code the learner may not call; its plain data is handed to ``collect`` as ``inputs=``,
  and to ``judge`` too when it takes an ``inputs`` keyword (the judge may trust those: they never
  came back from the sandbox).
- ``expect`` (optional) computes what the judge compares with, when that is costly (a reference
  run, a measurement): the grade runs it while the learner's side runs, and hands its result to
  ``judge`` as ``expected=``; it never crosses into the sandbox.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

from course_lib.grading.verdicts import fail

__all__ = ["CollectFailed", "SplitCheck", "need", "need_list", "split_check"]


class CollectFailed:
    """What crosses when the learner's side ended in a ✗ verdict (its one line)."""

    KEY = "__collect_failed__"


class SplitCheck:
    """A check whose learner side and judge side can run in two processes (module doc)."""

    def __init__(
        self,
        collect: Callable[..., Any],
        judge: Callable[..., None],
        prepare: Callable[..., Any] | None = None,
        expect: Callable[..., Any] | None = None,
    ):
        named = (("collect", collect), ("judge", judge), ("prepare", prepare), ("expect", expect))
        for name, fn in named:
            if fn is not None and not callable(fn):
                raise TypeError(f"{name} = {fn!r}: expected a function")
        self.collect, self.judge, self.prepare, self.expect = collect, judge, prepare, expect
        task = inspect.signature(collect).parameters.get("task")
        if task is None or not isinstance(task.default, int):
            raise TypeError(
                f"collect = {collect.__qualname__}: expected a keyword 'task' with the task "
                "number as its default"
            )
        self.task: int = task.default
        self._judge_takes_inputs = "inputs" in inspect.signature(judge).parameters
        self.__name__ = collect.__name__.replace("collect_", "check_", 1)
        self.__qualname__ = self.__name__
        self.__module__ = collect.__module__
        self.__doc__ = collect.__doc__

    def __repr__(self) -> str:
        return f"<graded check {self.__module__}.{self.__name__} (task {self.task})>"

    # --------------------------------------------------------------- the halves, one by one
    def inputs(self, task: int | None = None) -> Any:
        """The judge-side inputs (``prepare``), as plain data; None without ``prepare``."""
        if self.prepare is None:
            return None
        from course_lib.grading.plain import roundtrip

        return roundtrip(self.prepare(task=self.task if task is None else task))

    def run_collect(self, *args: Any, task: int | None = None, inputs: Any = None) -> Any:
        """The learner's side: its plain data, or ``{CollectFailed.KEY: "✗ ..."}`` when it
        ended in a ✗ verdict (the learner's function raised, was not callable, ...)."""
        task = self.task if task is None else task
        kwargs: dict[str, Any] = {"task": task}
        if self.prepare is not None:
            kwargs["inputs"] = inputs
        try:
            return self.collect(*args, **kwargs)
        except AssertionError as exc:
            lines = str(exc).strip().splitlines()
            line = lines[0] if lines else ""
            if not line.startswith("✗"):
                line = f"✗ task {task}: {line or 'AssertionError'}"
            return {CollectFailed.KEY: line[:500]}

    def expected(self, task: int | None = None) -> Any:
        """What the judge compares with, computed ahead by ``expect`` (the grade does it while
        the learner's side runs; it never crosses into the sandbox); None without ``expect``."""
        if self.expect is None:
            return None
        return self.expect(task=self.task if task is None else task)

    def run_judge(
        self, data: Any, task: int | None = None, inputs: Any = None, expected: Any = None
    ) -> None:
        """The judge's side on ``data`` (plain, already decoded): prints ✓ or raises ✗.
        ``inputs``: what ``prepare`` gave the learner's side (computed on this side, so the
        judge may trust it; ``data`` it may not)."""
        task = self.task if task is None else task
        if isinstance(data, dict) and CollectFailed.KEY in data:
            line = str(data[CollectFailed.KEY])
            # the learner's side may say anything here: it can only fail the task
            raise AssertionError(line if line.startswith("✗") else f"✗ task {task}: {line}")
        self._judge(data, task, inputs, expected)

    def _judge(self, data: Any, task: int, inputs: Any, expected: Any) -> None:
        kwargs: dict[str, Any] = {"task": task}
        if self._judge_takes_inputs:
            kwargs["inputs"] = inputs
        if self.expect is not None:
            kwargs["expected"] = expected if expected is not None else self.expected(task)
        self.judge(data, **kwargs)

    # --------------------------------------------------------------- the self-check
    def __call__(self, *args: Any, task: int | None = None) -> None:
        """Both halves in this process (the learner's self-check; nbval), the data passed
        through the same encoding the grade uses."""
        from course_lib.grading.plain import roundtrip

        task = self.task if task is None else task
        kwargs: dict[str, Any] = {"task": task}
        if self.prepare is not None:
            kwargs["inputs"] = self.inputs(task)
        data = self.collect(*args, **kwargs)  # a ✗ raised here shows as it always did
        self._judge(roundtrip(data), task, kwargs.get("inputs"), None)


def split_check(
    collect: Callable[..., Any],
    judge: Callable[..., None],
    prepare: Callable[..., Any] | None = None,
    expect: Callable[..., Any] | None = None,
) -> SplitCheck:
    """The graded check made of ``collect`` (learner side) and ``judge`` (module doc)."""
    return SplitCheck(collect, judge, prepare, expect)


def need(task: int, data: Any, key: str, kind: type | tuple[type, ...], what: str = "") -> Any:
    """``data[key]`` if ``data`` is a dict holding a value of type ``kind`` there; otherwise the
    ✗ verdict "the run handed back no <what>". For the judge: it trusts nothing it is given."""
    value = data.get(key) if isinstance(data, dict) else None
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        fail(task, f"the run handed back no {what or key} (got {type(value).__name__})")
    return value


def need_list(task: int, data: Any, n: int, what: str, per: str = "cases") -> list[Any]:
    """``data`` if it is a list of ``n`` items; otherwise the ✗ verdict "the run handed back no
    <what> for each of the <n> <per>". For the judge: it trusts nothing it is given."""
    if not isinstance(data, list) or len(data) != n:
        fail(task, f"the run handed back no {what} for each of the {n} {per}")
    return data
