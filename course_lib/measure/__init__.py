"""Measurement: memory (MemoryMeter), timing, communication, and every formula (estimate).

``estimate`` is imported eagerly (it needs no torch); the rest on first use, so planning code
that only needs formulas stays light.
"""

from __future__ import annotations

from typing import Any

from course_lib.measure import estimate  # noqa: F401
from course_lib.runtime.interrupts import import_whole

_LAZY = {
    "MemoryMeter": "course_lib.measure.memory",
    "CATEGORIES": "course_lib.measure.memory",
    "CommMeter": "course_lib.measure.comm",
    "time_fn": "course_lib.measure.timing",
    "TimingResult": "course_lib.measure.timing",
    "EventLog": "course_lib.measure.timing",
    "merge_event_logs": "course_lib.measure.timing",
}

__all__ = ["estimate", *_LAZY]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'course_lib.measure' has no attribute {name!r}")
    value = getattr(import_whole(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
