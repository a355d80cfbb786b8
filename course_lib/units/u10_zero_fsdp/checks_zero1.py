"""Unit 10's task 1 (solutions/10_zero_fsdp.ipynb): the ZeRO-1 step. Re-exported by
:mod:`checks`.

``collect_zero1_step`` runs the learner's step on 3 real ranks inside the check's flat padded
layout (``_check_parts.FlatModel``) and hands back each rank's record of 3 AdamW steps (its own
parameters and local gradients), what each step left (the local gradients handed in,
``shard.grad``, ``flat_param``) and the size of the optimizer's state; ``judge_zero1_step``
averages the gradients over the ranks, runs one process on the full batch and compares.
"""

from __future__ import annotations

from typing import Any

from course_lib.grading.core import error_pair, fail, launch_learner, passed
from course_lib.grading.split import need, split_check

__all__ = ["check_zero1_step", "ZERO_REFERENCES"]

#: the course's ZeRO, out of reach while the learner's code runs (tasks 1 and 3)
ZERO_REFERENCES = (
    "course_lib.parallel.zero.common:ZeroDataParallel",
    "course_lib.parallel.zero.sharded:ShardedOptimizer",
    "course_lib.parallel.zero.full:FullySharded",
)
GRADE_TIMEOUT_S = 90.0


def _launch(task: int, worker, world_size: int, *args) -> list[dict]:
    return launch_learner(task, worker, world_size, *args, timeout=GRADE_TIMEOUT_S)


def _zero1_worker(rank: int, world_size: int, fn, forbid, case) -> dict:
    """3 AdamW steps with the learner's ZeRO-1 step in this rank: the run's record (this rank's
    own parameters and local gradients), what each step left (``ZeroStep``) and the size of the
    optimizer's state."""
    import torch

    from course_lib.grading.records import plain_record
    from course_lib.parallel import harness as H
    from course_lib.units.u10_zero_fsdp._check_parts import FlatModel, ZeroStep, _case_fns

    model_fn, batch_fn = _case_fns(case)
    layout = FlatModel(model_fn(), world_size, rank)  # the same seed on every rank
    stepper = ZeroStep(layout, rank, world_size, fn, forbid)
    try:
        record = H.parallel_run(
            layout.model,
            batch_fn,
            steps=3,
            optimizer_fn=lambda m: stepper,
            shard=(rank, world_size),
        )
    except Exception as exc:  # noqa: BLE001 - reported in the verdict
        return {"used": stepper.used, "error": error_pair(exc)}
    state = sum(
        t.numel()
        for st in layout.optimizer.state.values()
        for t in st.values()
        if isinstance(t, torch.Tensor) and t.dim()
    )
    return {
        "used": stepper.used,
        "record": plain_record(record),
        "state": state,
        "steps": stepper.steps,
    }


ZERO1_WORLD_SIZE = 3  # the drawn width never makes the parameter count a multiple: padding


def collect_zero1_step(fn, task: int = 1) -> dict:
    """Task: ``fn(flat_param, flat_grad, shard, optimizer)``: ``flat_param`` (N*s,) holds every
    parameter on every rank, ``flat_grad`` (N*s,) this rank's local gradients, ``shard`` is the
    (s,) view of this rank's slice of ``flat_param`` and ``optimizer`` (AdamW) updates it only.
    After the call every rank's ``flat_param`` must hold the parameters one process would have
    after an AdamW step on the full batch.

    Graded on 3 ranks, 3 steps of a float64 MLP of drawn width (its parameters never a multiple
    of 3: padding), seeds drawn: after each step ``shard.grad`` must be the mean over ranks of
    the rank's slice and every rank's copy the same; then losses, mean gradients and every
    rank's parameters against one process."""
    from course_lib.units.u10_zero_fsdp._cases import training_case

    if not callable(fn):
        fail(task, f"expected a function, got {type(fn).__name__} {fn!r}")
    world_size = ZERO1_WORLD_SIZE
    case = training_case(task, world_size)
    results = _launch(task, _zero1_worker, world_size, fn, list(ZERO_REFERENCES), case)
    return {"ranks": [{k: r.get(k) for k in ("record", "state", "steps")} for r in results]}


def _zero1_steps(task: int, results: list[dict], numel: int) -> list[list[dict]]:
    """Every rank's steps as handed back: the local gradients, ``shard.grad`` (or None) and
    ``flat_param`` after the step, each (N*s,) but ``shard.grad``; checked."""
    import torch

    def ok(step: Any) -> bool:
        return (
            isinstance(step, dict)
            and all(
                isinstance(step.get(k), torch.Tensor) and tuple(step[k].shape) == (numel,)
                for k in ("grad", "flat")
            )
            and (step.get("shard_grad") is None or isinstance(step["shard_grad"], torch.Tensor))
        )

    steps = [r.get("steps") for r in results]
    if not all(isinstance(s, list) and len(s) == 3 and all(map(ok, s)) for s in steps):
        fail(task, "the run handed back no record of what each of its 3 steps left")
    return steps  # type: ignore[return-value]


def _step_note(rank: int, k: int, steps: list[list[dict]]) -> str:
    """What the check sees after step ``k`` on ``rank``: ``shard.grad`` against the mean over
    ranks of this rank's slice of the local gradients, and every rank's ``flat_param`` against
    this one's ("" when both are right)."""
    import torch

    world_size = len(steps)
    mean = torch.stack([st[k]["grad"] for st in steps]).sum(0) / world_size
    s = mean.numel() // world_size
    want = mean[rank * s : (rank + 1) * s]
    grad = steps[rank][k]["shard_grad"]
    note = ""
    if grad is None or grad.shape != want.shape or grad.dtype != want.dtype:
        note = f"shard.grad is {'None' if grad is None else tuple(grad.shape)} after your step"
    elif not torch.allclose(grad, want, rtol=1e-9, atol=1e-12):
        ratio = float(grad.flatten() @ want.flatten() / (want.flatten() @ want.flatten()))
        note = (
            f"shard.grad is {ratio:.3g} x the mean over ranks of this rank's slice"
            if torch.allclose(grad, ratio * want, rtol=1e-6, atol=1e-12)
            else "shard.grad is not the mean over ranks of this rank's slice of the gradients"
        )
    copies = [st[k]["flat"] for st in steps]
    other = next((q for q, c in enumerate(copies) if not torch.equal(c, copies[rank])), None)
    if not note and other is not None:
        note = (
            f"after your step rank {rank}'s flat_param differs from rank {other}'s in "
            f"{int((copies[other] != copies[rank]).sum())} elements: the ranks' copies disagree"
        )
    return note


def _first_note(steps: list[list[dict]]) -> str:
    """The first rank's first note (``_step_note``), as the hint of a mismatch."""
    for rank, mine in enumerate(steps):
        for k in range(len(mine)):
            note = _step_note(rank, k, steps)
            if note:
                return f"; at step {k + 1} on rank {rank} {note}"
    return ""


def _with_mean_grads(task: int, records: list, where: str) -> list:
    """The records with each step's gradients replaced by their mean over ranks (what the step
    should apply; the ranks hand back their own local gradients)."""
    n = len(records)
    for k in range(len(records[0].grads)):
        names = records[0].grads[k].keys()
        if any(
            len(r.grads) <= k
            or r.grads[k].keys() != names
            or any(r.grads[k][m].shape != records[0].grads[k][m].shape for m in names)
            for r in records
        ):
            fail(task, f"{where}: the ranks handed back gradients of different parameters")
        mean = {m: sum(r.grads[k][m] / n for r in records) for m in names}
        for r in records:
            r.grads[k] = mean
    return records


def judge_zero1_step(data: Any, task: int = 1) -> None:
    from course_lib.grading.records import first_mismatch, need_record
    from course_lib.parallel import harness as H
    from course_lib.units.u10_zero_fsdp._cases import training_case
    from course_lib.units.u10_zero_fsdp._check_parts import _case_fns
    from course_lib.units.u10_zero_fsdp.checks_parity import rank_results
    from course_lib.units.u10_zero_fsdp.run import _adamw

    world_size = ZERO1_WORLD_SIZE
    case = training_case(task, world_size)
    model_fn, batch_fn = _case_fns(case)
    s = -(-sum(p.numel() for p in model_fn().parameters()) // world_size)  # the shard's size
    where = f"on {world_size} ranks (MLP of width {case['width']})"
    results = rank_results(task, data, world_size)
    for rank, res in enumerate(results):
        state = need(task, res, "state", int, "size of the optimizer's state")
        if state != 2 * s:
            fail(
                task,
                f"{where}, rank {rank}: the optimizer holds {state} elements of state, "
                f"expected 2 x the shard's {s}: keep the optimizer on the shard",
            )
    seen = _first_note(_zero1_steps(task, results, world_size * s))
    records = _with_mean_grads(
        task, [need_record(task, r.get("record"), where) for r in results], where
    )
    reference = H.reference_run(model_fn, batch_fn, steps=3, optimizer_fn=_adamw)
    first_mismatch(task, H.compare(reference, records), where.removeprefix("on "), seen)
    passed(
        task,
        "ZeRO-1 step matches one process on 3 ranks (AdamW, 3 steps, padded shards), on every rank",
    )


check_zero1_step = split_check(collect_zero1_step, judge_zero1_step)
