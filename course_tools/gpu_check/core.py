"""What a check is, what it gives back, and how one runs: alone, in its own process, in time.

A check is a function of :class:`Settings` returning an :class:`Outcome` (its figures, and
"failed" or "skipped" when it says so). :func:`run_check` runs it in a fresh process through
``course_lib.launch(..., 1, backend="gloo")``: an exception, a CUDA error that poisons the
process, a crash or a hang ends that process only, and ``timeout_s`` bounds it. A check that
starts ranks itself (the NCCL check) runs in the caller, since ranks cannot launch ranks; its own
``launch`` call carries the time bound.
"""

from __future__ import annotations

import time
import traceback
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

import course_lib

#: the devices the check runs on; ``cpu`` runs every path it can and skips the CUDA-only ones
Device = Literal["cuda", "cpu"]
DEVICES: tuple[Device, ...] = ("cuda", "cpu")
Status = Literal["passed", "failed", "skipped"]
#: the four parts of the check (issue 23, item 9), by letter
Group = Literal["a", "b", "c", "d"]
GROUP_TITLES: dict[Group, str] = {
    "a": "single-GPU unit runs",
    "b": "memory meter against the CUDA allocator",
    "c": "pinned vs pageable host-device copies",
    "d": "NCCL collectives through course_lib.launch",
}
#: a measured figure as the report prints it
Figure = str | int | float | bool

_MAX_ERROR_CHARS = 4000
_MAX_WARNINGS = 5


@dataclass(frozen=True)
class Settings:
    """What every check is told."""

    device: Device
    """where the course's code runs"""
    timeout_s: float
    """seconds one check may take (a check that launches ranks passes it to ``launch``)"""


@dataclass(frozen=True)
class Outcome:
    """What a check function returns: its figures, and whether it passed."""

    figures: Mapping[str, Figure] = field(default_factory=dict)
    """name (with its unit) -> value, in the order the report lists them"""
    status: Status = "passed"
    note: str = ""
    """why it failed or was skipped (one sentence); empty when it passed"""
    error: str = ""
    """the traceback or launch error, when the check raised"""
    warnings: tuple[str, ...] = ()
    """distinct warnings the check's code emitted (the first few)"""


@dataclass(frozen=True)
class Check:
    """One named check."""

    name: str
    group: Group
    run: Callable[[Settings], Outcome]
    needs_cuda: bool = False
    """skipped with ``--device cpu``: nothing of it can run without CUDA"""
    in_caller: bool = False
    """runs in the calling process (it launches ranks itself); otherwise in a rank of its own"""


@dataclass(frozen=True)
class CheckResult:
    """One line of the report: a check, how it ended, and what it measured."""

    name: str
    group: Group
    outcome: Outcome
    seconds: float
    about: str = ""
    """what the check does (its function's docstring)"""

    @property
    def status(self) -> Status:
        return self.outcome.status


def skipped(note: str, figures: Mapping[str, Figure] | None = None) -> Outcome:
    """An outcome for a check (or the part of it that matters) that could not run here."""
    return Outcome(dict(figures or {}), "skipped", note)


def failed(note: str, figures: Mapping[str, Figure] | None = None) -> Outcome:
    """An outcome for a check that ran and found something wrong."""
    return Outcome(dict(figures or {}), "failed", note)


def _short(text: str) -> str:
    text = text.strip()
    return text if len(text) <= _MAX_ERROR_CHARS else "...\n" + text[-_MAX_ERROR_CHARS:]


def _about(check: Check) -> str:
    """The first paragraph of the check function's docstring, on one line."""
    return " ".join((check.run.__doc__ or "").strip().split("\n\n")[0].split())


def call_check(check: Check, settings: Settings) -> tuple[Outcome, float]:
    """Run ``check`` here, catching what it raises; return its outcome and its seconds."""
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            outcome = check.run(settings)
        except Exception as exc:  # a failing check must not stop the others
            outcome = Outcome(
                status="failed",
                note=f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
                error=_short(traceback.format_exc()),
            )
    seconds = time.perf_counter() - start
    seen = tuple(dict.fromkeys(f"{w.category.__name__}: {w.message}"[:200] for w in caught))
    return replace(outcome, warnings=seen[:_MAX_WARNINGS]), seconds


def _in_rank(rank: int, world_size: int, check: Check, settings: Settings) -> tuple[Outcome, float]:
    """The body of the one rank a check runs in."""
    return call_check(check, settings)


def run_check(check: Check, settings: Settings) -> CheckResult:
    """Run one check in isolation, bounded by ``settings.timeout_s``; never raises."""
    if check.needs_cuda and settings.device != "cuda":
        outcome = skipped("needs CUDA (this run uses --device cpu)")
        return CheckResult(check.name, check.group, outcome, 0.0, _about(check))
    if check.in_caller:
        outcome, seconds = call_check(check, settings)
        return CheckResult(check.name, check.group, outcome, seconds, _about(check))
    start = time.perf_counter()
    try:
        [(outcome, seconds)] = course_lib.launch(
            _in_rank, 1, check, settings, backend="gloo", timeout=settings.timeout_s
        )
    except Exception as exc:  # the rank crashed, hung, or could not start
        seconds = time.perf_counter() - start
        first = str(exc).splitlines()[0] if str(exc) else ""
        outcome = Outcome(
            status="failed",
            note=f"{type(exc).__name__}: {first}",
            error=_short(f"{type(exc).__name__}: {exc}"),
        )
    return CheckResult(check.name, check.group, outcome, seconds, _about(check))


def run_checks(
    checks: tuple[Check, ...],
    settings: Settings,
    progress: Callable[[CheckResult], None] | None = None,
) -> list[CheckResult]:
    """Run every check in turn; ``progress`` is told of each result as it comes."""
    results = []
    for check in checks:
        result = run_check(check, settings)
        if progress is not None:
            progress(result)
        results.append(result)
    return results
