"""Unit 10's task 3 (solutions/10_zero_fsdp.ipynb): the stage-2 gradient hook that kept
everything, fixed. Re-exported by :mod:`checks`.

``collect_stage2_hook`` runs the learner's hook on 2 real ranks inside the check's own stage-2
layout (``_check_parts.Stage2Host``) and hands back each rank's record of 2 AdamW steps and the
gradient bytes MemoryMeter finds after one more backward; ``judge_stage2_hook`` runs one process
on the full batch and computes the bytes of the gradient shards from the drawn model.
"""

from __future__ import annotations

from typing import Any

from course_lib.grading.core import error_pair, fail, fmt_int, passed
from course_lib.grading.split import need, split_check

__all__ = ["check_stage2_hook"]

HOOK_WORLD_SIZE = 2


def _hook_worker(rank: int, world_size: int, fn, forbid, case) -> dict:
    """2 AdamW steps with the learner's hook in this rank, then one more backward: the run's
    record and the gradient bytes MemoryMeter finds after it."""
    from course_lib.grading.records import plain_record
    from course_lib.measure.memory import MemoryMeter
    from course_lib.parallel import harness as H
    from course_lib.units.u10_zero_fsdp._check_parts import Stage2Host, _case_fns
    from course_lib.units.u10_zero_fsdp.run import _self

    model_fn, batch_fn = _case_fns(case)
    model = Stage2Host(model_fn(), rank, world_size, fn, forbid)
    try:
        record = H.parallel_run(
            model,
            batch_fn,
            steps=2,
            optimizer_fn=_self,
            gather_fn=lambda m, which: model.gather(which),
            shard=(rank, world_size),
        )
        H.mse_loss(model, H.shard_batch(batch_fn(0), rank, world_size)).backward()
        with MemoryMeter(model, model.optimizer) as mem:
            pass
    except Exception as exc:  # noqa: BLE001 - reported in the verdict
        return {"used": model.used, "error": error_pair(exc)}
    return {
        "used": model.used,
        "record": plain_record(record),
        "grads": mem.start_breakdown["grads"],
    }


def collect_stage2_hook(fn, task: int = 3) -> dict:
    """Task: ``fn(params, shard)`` runs once backward has produced the gradient of every
    parameter in ``params`` (one unit, flattened end to end and padded to N x s elements):
    it puts this rank's (s,) slice of their mean over ranks into ``shard.grad`` (adding to it if
    present) and keeps nothing else. Graded on 2 ranks, an MLP of drawn width and seeds: 2 AdamW
    steps against one process, and after a backward the gradients MemoryMeter finds must be the
    shards' bytes alone."""
    from course_lib.units.u10_zero_fsdp._cases import training_case
    from course_lib.units.u10_zero_fsdp.checks_zero1 import ZERO_REFERENCES, _launch

    if not callable(fn):
        fail(task, f"expected a function, got {type(fn).__name__} {fn!r}")
    case = training_case(task, HOOK_WORLD_SIZE)
    results = _launch(task, _hook_worker, HOOK_WORLD_SIZE, fn, list(ZERO_REFERENCES), case)
    return {"ranks": [{k: r.get(k) for k in ("record", "grads")} for r in results]}


def _shard_bytes(model, world_size: int) -> int:
    """Bytes of one rank's gradient shards: per unit (a module owning parameters) its
    parameters flattened, padded to a multiple of ``world_size`` and cut in ``world_size``."""
    total = 0
    for module in model.modules():
        own = list(module.parameters(recurse=False))
        if own:
            s = -(-sum(p.numel() for p in own) // world_size)
            total += s * own[0].element_size()
    return total


def judge_stage2_hook(data: Any, task: int = 3) -> None:
    from course_lib.grading.records import first_mismatch, need_record
    from course_lib.parallel import harness as H
    from course_lib.units.u10_zero_fsdp._cases import training_case
    from course_lib.units.u10_zero_fsdp._check_parts import _case_fns
    from course_lib.units.u10_zero_fsdp.checks_parity import rank_results
    from course_lib.units.u10_zero_fsdp.run import _adamw

    case = training_case(task, HOOK_WORLD_SIZE)
    model_fn, batch_fn = _case_fns(case)
    ranks = f"{HOOK_WORLD_SIZE} ranks (MLP of width {case['width']})"
    results = rank_results(task, data, HOOK_WORLD_SIZE)
    records = [need_record(task, r.get("record"), f"on {ranks}") for r in results]
    reference = H.reference_run(model_fn, batch_fn, steps=2, optimizer_fn=_adamw)
    first_mismatch(task, H.compare(reference, records), ranks)
    shards = _shard_bytes(model_fn(), HOOK_WORLD_SIZE)
    for rank, res in enumerate(results):
        grads = need(task, res, "grads", int, "gradient bytes MemoryMeter found")
        if grads != shards:
            fail(
                task,
                f"rank {rank}: after backward MemoryMeter finds {fmt_int(grads)} B "
                f"of gradients; stage 2 keeps only the shards, {fmt_int(shards)} B: "
                "free the full gradients once they are reduce-scattered",
            )
    passed(
        task,
        "the stage-2 hook matches one process on 2 ranks and keeps only the gradient "
        "shards (MemoryMeter)",
    )


check_stage2_hook = split_check(collect_stage2_hook, judge_stage2_hook)
