"""The capstone planner: lay a training run out on a cluster, predict its memory and its speed.

``plan(model, cluster, global_batch_tokens=..., total_tokens=...)`` enumerates dp x tp x pp
layouts (x ZeRO stage, recomputation, micro-batch, interleaving), keeps those whose per-GPU
memory fits, ranks them by predicted step time, and ``explain(result)`` says why the winner
wins (and, from ``layout_thresholds``, why a layout is communication-bound);
``launch_command(result)`` is the torchrun line (or sbatch file) that starts the winner.
``predict_memory(model, layout)`` gives one layout's per-rank memory by category: what a
measured or virtual run of that layout is compared with. ``efficiency_from_gpu_check`` and
``fit_efficiency`` replace the assumed matmul efficiency by a measured one. Every formula is in
``course_lib.measure.estimate``. Introduced in notebooks/14_planning_a_run.ipynb.
"""

from course_lib.plan.calibrate import efficiency_from_gpu_check, fit_efficiency
from course_lib.plan.comm_model import ASSUMPTION_SOURCES, DEFAULT_ASSUMPTIONS, Assumptions
from course_lib.plan.explain import explain
from course_lib.plan.launch import launch_command, layout_of
from course_lib.plan.memory import (
    MEMORY_CATEGORIES,
    check_layout,
    layers_per_stage,
    microbatches,
    predict_memory,
    stage_layers,
)
from course_lib.plan.planner import (
    DEFAULT_EFFICIENCY,
    DEFAULT_RESERVE,
    TIME_PARTS,
    evaluate,
    plan,
    step_time,
)
from course_lib.plan.presets import (
    CLUSTERS,
    MODELS,
    NVLINK_NCCL_FRACTION,
    cluster,
    model,
    this_machine,
)
from course_lib.plan.specs import ATTENTION, RECOMPUTE, ClusterSpec, Layout, ModelSpec
from course_lib.plan.thresholds import layout_thresholds
from course_lib.plan.virtual_check import TOLERANCE as VIRTUAL_TOLERANCE
from course_lib.plan.virtual_check import compare_with_virtual

__all__ = [
    "efficiency_from_gpu_check",
    "fit_efficiency",
    "ASSUMPTION_SOURCES",
    "DEFAULT_ASSUMPTIONS",
    "Assumptions",
    "MEMORY_CATEGORIES",
    "check_layout",
    "launch_command",
    "layout_of",
    "layers_per_stage",
    "microbatches",
    "predict_memory",
    "stage_layers",
    "DEFAULT_EFFICIENCY",
    "DEFAULT_RESERVE",
    "TIME_PARTS",
    "evaluate",
    "explain",
    "layout_thresholds",
    "plan",
    "step_time",
    "CLUSTERS",
    "MODELS",
    "NVLINK_NCCL_FRACTION",
    "RECOMPUTE",
    "ATTENTION",
    "ClusterSpec",
    "Layout",
    "ModelSpec",
    "cluster",
    "model",
    "this_machine",
    "compare_with_virtual",
    "VIRTUAL_TOLERANCE",
]
