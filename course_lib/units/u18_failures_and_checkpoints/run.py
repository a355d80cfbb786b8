"""Unit 18's measured runs (notebooks/18_failures_and_checkpoints.ipynb): distributed checkpoints
that reshard, a rank killed and the run resumed under torchrun, and what failures cost at scale.

- saving and loading (``run_reshard.py``): :func:`reshard_run` (saved on 4 ranks, continued on
  4, 2 and 1, bit for bit), :func:`forget_table` / :func:`forget_summary` (a resume that forgot
  one part of the state), :func:`bad_checkpoints` (what load says about a damaged one);
- failures (``run_elastic.py``): :func:`elastic_run` (the run torchrun restarts, exported as
  ``u18.elastic``), :func:`torchrun_elastic`, :func:`read_timeline`, :func:`restart_summary`;
- cost (``run_cost.py``): :func:`save_cost` (bytes and seconds against size, blocking and async);
- trouble (``run_trouble.py``): :func:`hung_collective`, :func:`straggler_table`,
  :func:`grad_norm_table` (the clipping bug of sharded runs);
- at scale (``run_scale.py``): :data:`LLAMA3`, :func:`gpu_mtbf_s`, :func:`scale_table`,
  :func:`goodput_curve`.
"""

from __future__ import annotations

from course_lib.units.u18_failures_and_checkpoints.run_cost import save_cost
from course_lib.units.u18_failures_and_checkpoints.run_elastic import (
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
from course_lib.units.u18_failures_and_checkpoints.run_scale import (
    PARAMS_405B,
    goodput_curve,
    gpu_mtbf_s,
    scale_table,
)
from course_lib.units.u18_failures_and_checkpoints.run_trouble import (
    grad_norm_table,
    hung_collective,
    straggler_table,
)

__all__ = [
    "save_cost",
    "PARAMS_405B",
    "goodput_curve",
    "gpu_mtbf_s",
    "scale_table",
    "grad_norm_table",
    "hung_collective",
    "straggler_table",
    "elastic_run",
    "read_timeline",
    "restart_summary",
    "torchrun_elastic",
    "bad_checkpoints",
    "forget_summary",
    "forget_table",
    "reshard_run",
]
