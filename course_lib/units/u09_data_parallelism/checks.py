"""Unit 09's graded checks (solutions/09_data_parallelism.ipynb, exercises/09_data_parallelism.ipynb).

1. ``check_bucketed_hook``: the learner's bucketed gradient hook, run on 2 and 3 real gloo ranks
   (inside the ranks under ``watch_references``: the course's DataParallel is out of reach), two
   SGD steps against one process on the full batch (parallel.harness), and every bucket
   all-reduced asynchronously during backward, in bucket order;
2. ``check_no_sync_loop``: the fixed accumulation loop: the gradients of the whole batch and one
   all-reduce per bucket per optimizer step, counted on 2 ranks;
3. ``check_accumulation_steps``: the batch arithmetic DeepSpeed asserts (the sources' config bug);
4. ``check_bytes_prediction``: bytes each rank sends per optimizer step, against bytes measured
   on the wire by the OS in real runs (gloo's headers allowed for).
Each check prints one deterministic line or raises AssertionError("✗ task N: ...").

Every check is split in two (:mod:`course_lib.grading.split`): ``collect_X`` runs the learner's
code (on ranks: what each rank's run recorded and the calls it made, :mod:`.checks_ranks`) and
``judge_X`` computes what is expected (one process on the full batch, the course's own runs on
ranks) and gives the verdict. Tasks 3 and 4 live in :mod:`.checks_batch`.
"""

from __future__ import annotations

from typing import Any

from course_lib.grading.calls import need_records, need_runs
from course_lib.grading.core import fail, launch_learner, passed
from course_lib.grading.records import first_mismatch, need_record
from course_lib.grading.split import split_check
from course_lib.units.u09_data_parallelism.checks_batch import (  # noqa: F401 (re-exported)
    BYTE_CASES,
    BYTE_WIDTHS,
    HEADER_ALLOWANCE,
    UNIT,
    batch_cases,
    check_accumulation_steps,
    check_bytes_prediction,
)
from course_lib.units.u09_data_parallelism.checks_ranks import (  # noqa: F401 (re-exported)
    GRADE_TIMEOUT_S,
    HOOK_CAP_MB,
    HOOK_WORLD_SIZES,
    LOOP_WORLD_SIZES,
    MICRO_STEPS,
    _hook_worker,
    _loop_worker,
    check_buckets,
    need_grads,
    need_steps,
    training_case,
)

__all__ = [
    "check_bucketed_hook",
    "check_no_sync_loop",
    "check_accumulation_steps",
    "check_bytes_prediction",
    "HOOK_REFERENCES",
]

#: the course's answers to task 1, out of reach while the learner's hook runs
HOOK_REFERENCES = (
    "course_lib.parallel.ddp.data_parallel:DataParallel",
    "course_lib.parallel.ddp.data_parallel:allreduce_gradients",
)
# (not torch's DistributedDataParallel: torch itself calls its class methods during any
# backward; and a DDP wrapper the harness never calls would average nothing)


def _launch(task: int, worker, world_size: int, *args) -> list[dict]:
    return launch_learner(task, worker, world_size, *args, timeout=GRADE_TIMEOUT_S)


# --------------------------------------------------------------------------------------------
# task 1: the bucketed gradient hook
# --------------------------------------------------------------------------------------------
def _check_hook_calls(task: int, where: str, k: int, step: dict, expected: list[int]) -> None:
    """One rank's step: one asynchronous all_reduce per bucket during backward, in bucket
    order, and no other collective call (``where``: "rank r of N")."""
    during = step["during"]
    ops = [r["op"] for r in during]
    if ops != ["all_reduce"] * len(during) or len(during) != len(expected):
        fail(
            task,
            f"{where}, step {k + 1}: expected "
            f"{len(expected)} all_reduce calls during backward (one per "
            f"bucket, launched from the hook), got {ops}",
        )
    if not all(r["async"] for r in during):
        fail(
            task,
            f"{where}: an all-reduce launched from the "
            "hook blocked backward; launch it with async_op=True and wait in "
            "finish()",
        )
    if [r["bytes"] for r in during] != expected:
        fail(
            task,
            f"{where}: buckets went out as "
            f"{[r['bytes'] for r in during]} B, expected {expected} B in bucket "
            "order (each bucket flattened into one tensor)",
        )
    calls: dict[str, int] = {}
    for r in during + step["finish"]:
        calls[r["op"]] = calls.get(r["op"], 0) + 1
    extra = {op: n for op, n in calls.items() if op != "all_reduce"} or calls.get(
        "all_reduce", 0
    ) - len(expected)
    if extra:
        fail(
            task,
            f"{where}: finish() made more collective calls than one all-reduce per bucket: {calls}",
        )


def collect_bucketed_hook(fn, task: int = 1) -> dict[str, Any]:
    """Task: ``fn(model, buckets)`` registers hooks that all-reduce each bucket asynchronously
    as soon as its gradients have all arrived, and returns ``finish()``, to be called after
    ``loss.backward()``: it waits and leaves the mean over ranks in every ``.grad``.

    Graded on 2 and 3 ranks, 2 SGD steps of the float64 MLP (4 buckets): losses, gradients and
    parameters equal one process on the full batch within the harness tolerance; during each
    backward exactly one asynchronous all_reduce per bucket, in bucket order."""
    if not callable(fn):
        fail(task, f"expected a function, got {type(fn).__name__} {fn!r}")
    case = training_case(task)
    return {
        "runs": [
            _launch(task, _hook_worker, n, fn, list(HOOK_REFERENCES), case)
            for n in HOOK_WORLD_SIZES
        ]
    }


def judge_bucketed_hook(data: Any, task: int = 1) -> None:
    from course_lib.parallel import harness as H
    from course_lib.units.u09_data_parallelism.run import batch_fn, model_fn

    case = training_case(task)
    reference = H.reference_run(
        lambda seed: model_fn(case["seed"]), lambda s: batch_fn(case["batch"] + s), steps=2
    )
    sizes = {n: p.numel() * p.element_size() for n, p in model_fn(case["seed"]).named_parameters()}
    expected = [sum(sizes[n] for n in b) for b in check_buckets(case)]
    for world_size, results in zip(HOOK_WORLD_SIZES, need_runs(task, data, HOOK_WORLD_SIZES)):
        records = []
        for rank, res in enumerate(results):
            where = f"rank {rank} of {world_size}"
            for k, step in enumerate(need_steps(task, res.get("steps"), where, 2)):
                _check_hook_calls(task, where, k, step, expected)
            records.append(need_record(task, res.get("record"), where, steps="its training steps"))
        first_mismatch(task, H.compare(reference, records), f"{world_size} ranks")
    passed(
        task,
        "the bucketed hook matches one process on 2 and 3 ranks, with one "
        "asynchronous all-reduce per bucket launched during backward, in order",
    )


check_bucketed_hook = split_check(collect_bucketed_hook, judge_bucketed_hook)


# --------------------------------------------------------------------------------------------
# task 2: the accumulation loop
# --------------------------------------------------------------------------------------------
def collect_no_sync_loop(fn, task: int = 2) -> dict[str, Any]:
    """Task: ``fn(model, micro_batches)`` runs forward and backward on each (x, y) micro-batch
    of this rank so that the gradients are those of the whole batch, averaged over ranks, with
    one all-reduce per bucket for the whole optimizer step (``model.no_sync()``)."""
    if not callable(fn):
        fail(task, f"expected a function, got {type(fn).__name__} {fn!r}")
    case = training_case(task)
    return {"runs": [_launch(task, _loop_worker, n, fn, case) for n in LOOP_WORLD_SIZES]}


def _worst_grad(reference: dict, grads: dict) -> float:
    """The largest gradient difference from one process, in units of the tolerance."""
    return max(
        (
            float((grads[n] - g).abs().max()) / (1e-6 + 1e-5 * float(g.abs().max()))
            if n in grads and grads[n].shape == g.shape
            else float("inf")
        )
        for n, g in reference.items()
    )


def _loop_reference(case: dict, world_size: int) -> dict:
    """The gradients of one process on the whole batch the loop's ranks share."""
    from course_lib.parallel import harness as H
    from course_lib.units.u09_data_parallelism.run import batch_fn, model_fn

    rows = 8 * world_size * MICRO_STEPS
    return H.reference_run(
        lambda seed: model_fn(case["seed"]), lambda s: batch_fn(case["batch"], rows=rows)
    ).grads[0]


def judge_no_sync_loop(data: Any, task: int = 2) -> None:
    case = training_case(task)
    n = len(check_buckets(case))
    for world_size, results in zip(LOOP_WORLD_SIZES, need_runs(task, data, LOOP_WORLD_SIZES)):
        reference = _loop_reference(case, world_size)
        for rank, res in enumerate(results):
            where = f"rank {rank}"
            records = need_records(task, res.get("calls"), where)
            calls = sum(r["op"] == "all_reduce" for r in records)
            if calls != n:
                fail(
                    task,
                    f"rank {rank}: {calls} all-reduce calls for {MICRO_STEPS} micro-steps of "
                    f"a {n}-bucket model; expected {n} (communicate on the last micro-step "
                    "only)",
                )
            worst = _worst_grad(reference, need_grads(task, res.get("grads"), where))
            if not worst <= 1.0:
                fail(
                    task,
                    f"rank {rank}: the accumulated gradients differ from one process on the "
                    f"whole batch ({worst:.3g} x the tolerance); divide each "
                    "micro-batch loss by the number of micro-steps, and sync the last one",
                )
    passed(
        task,
        f"{MICRO_STEPS} micro-steps, one all-reduce per bucket, gradients of the whole "
        "batch on 2 ranks",
    )


check_no_sync_loop = split_check(collect_no_sync_loop, judge_no_sync_loop)
