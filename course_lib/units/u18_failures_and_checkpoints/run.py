"""Unit 18's measured runs (notebooks/18_failures_and_checkpoints.ipynb): distributed checkpoints
that reshard, a rank killed and the run resumed under torchrun, and what failures cost at scale.

- saving and loading (``run_reshard.py``): :func:`reshard_run` (saved on 4 ranks, continued on
  4, 2 and 1, bit for bit), :func:`forget_table` / :func:`forget_summary` (a resume that forgot
  one part of the state), :func:`bad_checkpoints` (what load says about a damaged one);
- failures (``run_elastic.py``): :func:`elastic_run` (the run torchrun restarts, exported as
  ``u18.elastic``), :func:`torchrun_elastic`, :func:`read_timeline`, :func:`restart_summary`;
"""

from __future__ import annotations

from course_lib.units.u18_failures_and_checkpoints._train import BATCH, CHUNKS, WIDTHS
from course_lib.units.u18_failures_and_checkpoints.run_elastic import (
    TIMELINE,
    elastic_run,
    read_timeline,
    restart_summary,
    torchrun_elastic,
)
from course_lib.units.u18_failures_and_checkpoints.run_reshard import (
    bad_checkpoints,
    forget_summary,
    forget_table,
    reshard_run,
)

__all__ = [
    "BATCH",
    "CHUNKS",
    "WIDTHS",
    "TIMELINE",
    "elastic_run",
    "read_timeline",
    "restart_summary",
    "torchrun_elastic",
    "bad_checkpoints",
    "forget_summary",
    "forget_table",
    "reshard_run",
]
