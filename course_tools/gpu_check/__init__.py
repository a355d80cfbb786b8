"""The GPU check: run the course's CUDA paths and write one report (issue 23, item 9).

    python -m course_tools.gpu_check                  # on a machine with a GPU: docs/gpu-check-DATE.md
    python -m course_tools.gpu_check --device cpu     # anywhere: the same code, CUDA parts skipped

Four parts: a. the run functions of units 01-07 that take a ``device`` (small sizes);
b. ``MemoryMeter`` against ``torch.cuda.max_memory_allocated``; c. pinned vs pageable copies;
d. an NCCL all-reduce through ``course_lib.launch``, one GPU per rank (with two GPUs or more).
Each check runs alone in its own process (``core.run_check``) within a time limit, so one that
fails, crashes or hangs does not stop the others. Without a GPU it says so and exits 0.
"""

from __future__ import annotations

from course_tools.gpu_check.catalog import CHECKS, find
from course_tools.gpu_check.cli import main
from course_tools.gpu_check.core import (
    DEVICES,
    Check,
    CheckResult,
    Outcome,
    Settings,
    run_check,
    run_checks,
)
from course_tools.gpu_check.report import Environment, environment, render, write_report

__all__ = [
    "CHECKS",
    "DEVICES",
    "Check",
    "CheckResult",
    "Environment",
    "Outcome",
    "Settings",
    "environment",
    "find",
    "main",
    "render",
    "run_check",
    "run_checks",
    "write_report",
]
