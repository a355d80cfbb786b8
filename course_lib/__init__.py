"""course_lib: the tested companion package of the course on training large neural networks.

The public names below are imported lazily, so ``python -m course_lib.grade`` and other
light entry points do not pay for ``import torch`` until they need it. That first import is
whole even if the notebook is interrupted meanwhile (``runtime.interrupts.import_whole``).
"""

from __future__ import annotations

from typing import Any

from course_lib.runtime.interrupts import import_whole

__version__ = "0.1.0"

_EXPORTS = {
    "launch": "course_lib.runtime.launch",
    "LaunchError": "course_lib.runtime.errors",
    "MemoryMeter": "course_lib.measure.memory",
    "estimate": "course_lib.measure",
    "rank_device": "course_lib.runtime.device",
    "hardware_report": "course_lib.runtime.device",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'course_lib' has no attribute {name!r}")
    value = getattr(import_whole(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
