"""Unit 10's graded checks (solutions/10_zero_fsdp.ipynb, exercises/10_zero_fsdp.ipynb).

1. ``check_zero1_step`` (``checks_zero1``): the learner's ZeRO-1 step (average the gradients, update this rank's
   shard, all-gather the parameters), run on 3 real gloo ranks inside a flat padded layout,
   3 AdamW steps against one process on the full batch (parallel.harness), every rank's copy;
2. ``check_memory_prediction``: bytes of parameters, gradients and optimizer state per rank for
   3 ranks (a world size the lecture does not show), against MemoryMeter in real ranks;
3. ``check_stage2_hook`` (``checks_stage2``): the fixed stage-2 gradient hook: parity with one
   process AND, measured by MemoryMeter after backward, only the gradient shards left (the bug
   frees nothing);
4. ``check_smallest_stage``: the lowest ZeRO stage that fits a model on a cluster.
The models, widths and plans are drawn from the grading seed (``_cases``): another seed asks
about other ones. Each check is split (course_lib.grading.split): ``collect_X`` runs the
learner's code (in the ranks it launches) and hands back what it produced and what was measured
around it; ``judge_X`` computes what is expected (one process on the full batch, the course's
ZeroDataParallel in real ranks, exact arithmetic) and prints one deterministic line or raises
AssertionError("✗ task N: ...").
"""

from __future__ import annotations

from typing import Any

from course_lib.grading.core import (
    error_pair,
    expect_int,
    fail,
    fmt_int,
    passed,
    run_learner,
)
from course_lib.grading.plain import learner_value
from course_lib.grading.split import split_check
from course_lib.units.u10_zero_fsdp.checks_stage2 import check_stage2_hook
from course_lib.units.u10_zero_fsdp.checks_zero1 import (
    GRADE_TIMEOUT_S,
    ZERO_REFERENCES,
    check_zero1_step,
)

__all__ = [
    "check_zero1_step",
    "check_memory_prediction",
    "check_stage2_hook",
    "check_smallest_stage",
    "ZERO_REFERENCES",
    "ESTIMATE_REFERENCES",
]

#: the course's formulas for per-rank ZeRO memory
ESTIMATE_REFERENCES = tuple(
    f"course_lib.measure.estimate.zero:{f}"
    for f in (
        "zero_layout_bytes_per_rank",
        "zero_padding",
        "zero_state_breakdown_per_rank",
        "zero_bytes_per_rank",
    )
)
# --------------------------------------------------------------------------------------------
# task 2: predict the memory per rank
# --------------------------------------------------------------------------------------------
MEMORY_WORLD_SIZE = 3
_CATS = ("params", "grads", "optimizer")
_STAGES = (0, 1, 2, 3)
_MEASURED: dict = {}  # the measured run per drawn width, once per process (it is deterministic)


def _measured_memory(width: int) -> list[dict]:
    from course_lib.runtime.launch import launch

    if width not in _MEASURED:
        from course_lib.units.u10_zero_fsdp._check_parts import _state_worker

        runs = launch(_state_worker, MEMORY_WORLD_SIZE, width, timeout=GRADE_TIMEOUT_S)
        _MEASURED[width] = [row for rows in runs for row in rows]
    return _MEASURED[width]


def _memory_units(task: int) -> list[list[int]]:
    """Task 2's drawn memory model, as the element counts of each unit's parameter tensors."""
    from course_lib.units.u10_zero_fsdp._cases import memory_case
    from course_lib.units.u10_zero_fsdp._check_parts import _memory_model_of
    from course_lib.units.u10_zero_fsdp.run import units_of

    return units_of(_memory_model_of(memory_case(task, MEMORY_WORLD_SIZE)["width"]))


def collect_memory_prediction(fn, task: int = 2) -> list[Any]:
    """Task: ``fn(units, stage, world_size)`` returns ``{"params", "grads", "optimizer"}``, the
    int bytes each rank holds after ``step()`` under ZeroDataParallel (float32, AdamW), where
    ``units`` lists the parameter-tensor sizes of each unit. Graded for stages 0-3 on 3 ranks
    against MemoryMeter in the ranks of a real run (every rank, exactly), for a memory model of
    drawn width (not the lecture's 250; some unit padded at 3 ranks)."""
    if not callable(fn):
        fail(task, f"expected a function, got {type(fn).__name__} {fn!r}")
    units = _memory_units(task)
    forbid = [*ESTIMATE_REFERENCES, *ZERO_REFERENCES]
    return [
        learner_value(
            run_learner(task, fn, [list(u) for u in units], stage, MEMORY_WORLD_SIZE, forbid=forbid)
        )
        for stage in _STAGES
    ]


def judge_memory_prediction(data: Any, task: int = 2) -> None:
    from course_lib.units.u10_zero_fsdp._cases import memory_case

    units = _memory_units(task)
    width = memory_case(task, MEMORY_WORLD_SIZE)["width"]
    got_all = data if isinstance(data, list) and len(data) == len(_STAGES) else [None] * 4
    try:
        measured = _measured_memory(width)
    except Exception as exc:  # noqa: BLE001
        fail(task, f"the measured run did not finish: {error_pair(exc)[1]}")
    for stage, got in zip(_STAGES, got_all):
        if not isinstance(got, dict) or not set(_CATS) <= set(got):
            fail(task, f"stage {stage}: expected a dict with params, grads, optimizer; got {got!r}")
        for row in (r for r in measured if r["stage"] == stage):
            for cat in _CATS:
                value = expect_int(task, f"stage {stage} {cat}", got[cat])
                if value != row[cat]:
                    fail(
                        task,
                        f"units {units}, stage {stage}, {MEMORY_WORLD_SIZE} ranks: you predicted "
                        f"{fmt_int(value)} B of {cat}; MemoryMeter finds "
                        f"{'more' if row[cat] > value else 'less'} in rank {row['rank']}",
                    )
    passed(
        task,
        f"params, grads and optimizer state of stages 0-3 on {MEMORY_WORLD_SIZE} ranks "
        "predicted to the byte (MemoryMeter, every rank)",
    )


check_memory_prediction = split_check(collect_memory_prediction, judge_memory_prediction)


# --------------------------------------------------------------------------------------------
# task 4: scale up (task 1: checks_zero1, task 3: checks_stage2)
# --------------------------------------------------------------------------------------------
def _state_gb(n: int, world_size: int, stage: int) -> float:
    from course_lib.units.u10_zero_fsdp._cases import _state

    return float(_state(n, world_size, stage)) / 1e9


def prepare_smallest_stage(task: int = 4) -> dict:
    """The drawn plans (the judge's side: drawing them computes their answers)."""
    from course_lib.units.u10_zero_fsdp._cases import plan_cases

    return {"plans": [list(plan) for plan in plan_cases(task)]}


def collect_smallest_stage(fn, task: int = 4, *, inputs: Any = None) -> list[Any]:
    """Task: ``fn(n_params, world_size, gpu_GB)`` returns the lowest ZeRO stage (an int 0-3)
    whose model state, 16 bytes per parameter (bf16 params and grads, fp32 master, m and v),
    fits in ``gpu_GB`` GB (1e9 B) per GPU, or None if none does. Graded on nine drawn plans
    (0.5B-400B parameters, 1-512 GPUs): every answer 0-3 and None, one GPU, two exact fits."""
    forbid = [*ESTIMATE_REFERENCES, "course_lib.units.u10_zero_fsdp.run_scale:smallest_stage"]
    return [
        learner_value(run_learner(task, fn, n, w, cap, forbid=forbid))
        for n, w, cap in inputs["plans"]
    ]


def judge_smallest_stage(data: Any, task: int = 4) -> None:
    from course_lib.units.u10_zero_fsdp._cases import lowest_stage, plan_cases

    cases = plan_cases(task)
    if not isinstance(data, list) or len(data) != len(cases):
        fail(task, f"the run handed back no answers for the {len(cases)} plans")
    for (n, w, cap), got in zip(cases, data):
        plan = f"{n / 1e9:g}B parameters on {w} GPU{'s' if w > 1 else ''} of {cap} GB"
        if got is not None:
            got = expect_int(task, f"the stage for {plan}", got)
        if got != lowest_stage(n, w, cap):
            seen = (
                f"stage {got} holds {_state_gb(n, w, got):g} GB per GPU"
                if got in (0, 1, 2, 3)
                else "that is not the lowest stage that fits (None when none does)"
            )
            fail(task, f"{plan}: you returned {got!r}; {seen}")
    passed(
        task,
        f"smallest stage right in {len(cases)} drawn plans: every stage, None, one GPU, exact fits",
    )


check_smallest_stage = split_check(
    collect_smallest_stage, judge_smallest_stage, prepare_smallest_stage
)
