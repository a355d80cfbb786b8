"""Unit 09's rank checks, what runs inside the ranks and how the judge reads it back.

The learner's side (tasks 1 and 2): the learner's hook or loop trains the check's MLP on real
gloo ranks and each rank hands back plain data: its harness record (losses, gradients,
parameters, :mod:`course_lib.grading.records`) or its gradients, and the calls its code made
(a :class:`~course_lib.grading.calls.CallLog`: CommMeter would price each all-reduce with
estimate's formulas, which the grade's sandbox stubs out in this unit). Nothing here computes
what is expected: the judge runs one process on the full batch itself.

Task 2's loop drives a :func:`_replica`, not the course's DataParallel: the sandbox makes every
method of DataParallel absent while unit 09 is graded (it is task 1's answer).
"""

from __future__ import annotations

import contextlib
from typing import Any

from course_lib.grading.calls import CallLog, need_records
from course_lib.grading.core import error_pair, fail
from course_lib.grading.records import named_tensors, plain_record

HOOK_CAP_MB = 0.0002  # 209 B: 4 buckets for the 6,800 B check model
MICRO_STEPS = 4
GRADE_TIMEOUT_S = 60.0
HOOK_WORLD_SIZES = (2, 3)  # task 1
LOOP_WORLD_SIZES = (2,)  # task 2


def cap_bytes() -> int:
    return int(HOOK_CAP_MB * 2**20)


def training_case(task: int) -> dict:
    """Tasks 1 and 2: the seeds of the MLP and of its batches, drawn from the grading seed."""
    from course_lib.grading.seeds import case_rng

    rng = case_rng(task, "u09_data_parallelism")
    return {"seed": rng.randrange(10_000), "batch": rng.randrange(10_000)}


def check_buckets(case: dict) -> list[list[str]]:
    """The parameter names of each bucket of the check's MLP, in launch order."""
    from course_lib.parallel.ddp import assign_buckets
    from course_lib.units.u09_data_parallelism.run import model_fn

    return assign_buckets(list(model_fn(case["seed"]).named_parameters()), cap_bytes())


# --------------------------------------------------------------------------------------------
# the learner's side
# --------------------------------------------------------------------------------------------
def _hook_worker(rank: int, world_size: int, fn, forbid, case) -> dict:
    """Two SGD steps with the learner's hook: the rank's record, and per step the calls made
    during backward and in finish()."""
    from course_lib.grading.references import watch_references
    from course_lib.parallel import harness as H
    from course_lib.units.u09_data_parallelism.run import batch_fn, model_fn

    model = model_fn(case["seed"])  # the same seed on every rank: no broadcast needed
    buckets = check_buckets(case)
    steps: list[dict] = []
    used: list[str] = []
    try:
        with watch_references(forbid) as used:
            finish = fn(model, [list(b) for b in buckets])
            if not callable(finish):
                raise TypeError(
                    f"fn(model, buckets) = a {type(finish).__name__}: expected a finish() function"
                )

            def step_fn(m, batch):
                loss = H.mse_loss(m, batch)
                with CallLog() as log:
                    loss.backward()
                    during = len(log.records)
                    finish()
                steps.append({"during": log.records[:during], "finish": log.records[during:]})
                return loss

            record = H.parallel_run(
                model,
                lambda s: batch_fn(case["batch"] + s),
                steps=2,
                step_fn=step_fn,
                shard=(rank, world_size),
            )
    except Exception as exc:  # noqa: BLE001 - reported in the verdict
        return {"used": list(used), "error": error_pair(exc)}
    return {"used": list(used), "record": plain_record(record), "steps": steps}


def _replica(module: Any, cap: int) -> Any:
    """What task 2's loop drives: the course's DataParallel as the loop sees it (``model(x)``,
    ``no_sync()``, ``.buckets``, an nn.Module around ``module``) and as the check counts it (one
    all-reduce per bucket, of its flattened gradients over the world size, at the end of each
    backward outside ``no_sync()``). The all-reduces run after backward and block: it is no
    answer to task 1."""
    import torch
    import torch.distributed as dist
    from torch import nn

    from course_lib.parallel.ddp import assign_buckets

    class Replica(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.module = module
            self.buckets = assign_buckets(list(module.named_parameters()), cap)
            self.require_sync, self._queued = True, False
            for p in module.parameters():
                p.register_post_accumulate_grad_hook(self._arrived)

        def forward(self, *args: Any, **kwargs: Any) -> Any:
            return self.module(*args, **kwargs)

        @contextlib.contextmanager
        def no_sync(self) -> Any:
            previous, self.require_sync = self.require_sync, False
            try:
                yield
            finally:
                self.require_sync = previous

        def _arrived(self, param: Any) -> None:
            if self.require_sync and not self._queued:
                self._queued = True
                torch.autograd.Variable._execution_engine.queue_callback(self._sync)

        def _sync(self) -> None:
            self._queued = False
            params = dict(self.module.named_parameters())
            for names in self.buckets:
                flat = torch.cat([params[n].grad.reshape(-1) for n in names])  # (bucket numel,)
                flat.div_(dist.get_world_size())
                dist.all_reduce(flat)
                for n, g in zip(names, flat.split([params[n].numel() for n in names])):
                    params[n].grad.copy_(g.view_as(params[n]))

    return Replica()


def _loop_worker(rank: int, world_size: int, fn, case) -> dict:
    """The learner's loop over this rank's micro-batches: its gradients and the calls made."""
    from course_lib.parallel import harness as H
    from course_lib.units.u09_data_parallelism.run import batch_fn, model_fn

    rows = 8 * world_size * MICRO_STEPS
    model = _replica(model_fn(case["seed"]), cap_bytes())
    x, y = H.shard_batch(batch_fn(case["batch"], rows=rows), rank, world_size)
    micro = list(zip(x.chunk(MICRO_STEPS), y.chunk(MICRO_STEPS)))
    try:
        with CallLog() as log:
            fn(model, micro)
    except Exception as exc:  # noqa: BLE001
        return {"error": error_pair(exc)}
    return {"calls": log.records, "grads": H.full_tensors(model, "grad")}


# --------------------------------------------------------------------------------------------
# the judge's reading
# --------------------------------------------------------------------------------------------
def need_steps(task: int, value: Any, where: str, count: int) -> list[dict]:
    """``count`` steps of calls ({"during": records, "finish": records}); the ✗ verdict if not."""
    if (
        not isinstance(value, list)
        or len(value) != count
        or not all(isinstance(s, dict) for s in value)
    ):
        fail(task, f"{where}: the run handed back no calls for its {count} steps")
    return [
        {k: need_records(task, step.get(k), where) for k in ("during", "finish")} for step in value
    ]


def need_grads(task: int, value: Any, where: str) -> dict:
    """A rank's gradients by name; the ✗ verdict if not."""
    if not named_tensors([value], 1):
        fail(task, f"{where}: the run handed back no gradients")
    return value
