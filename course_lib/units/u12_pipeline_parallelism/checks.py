"""Unit 12's graded checks (solutions/12_pipeline_parallelism.ipynb, exercises/12_pipeline_parallelism.ipynb).

1. ``check_bubble_prediction``: the learner's formula for the idle fraction of interleaved 1F1B
   (a schedule the lecture ran only at p = 4, m = 8, v = 2), against real runs on 2 and 3 ranks
   whose recorded orders are replayed on ideal hardware (``pipeline.replay``);
2. ``check_one_f_one_b``: the learner's 1F1B order of one stage, a list of ("F", i) / ("B", i),
   against PipeDream-Flush for several (p, m, stage);
3. ``check_holder``: the fixed placement of interleaved stages on ranks (the buggy one sent
   activations to the wrong stage), on a grid and in a real interleaved step on 2 ranks that
   must equal one process on the full batch.
Each check prints one deterministic line or raises AssertionError("✗ task N: ...").
"""

from __future__ import annotations

import math
import numbers

from course_lib.grading.core import fail, passed, run_learner

__all__ = [
    "check_bubble_prediction",
    "check_one_f_one_b",
    "check_holder",
    "BUBBLE_REFERENCES",
    "ORDER_REFERENCES",
    "HOLDER_REFERENCES",
]

BUBBLE_REFERENCES = (
    "course_lib.measure.estimate.compute:pipeline_bubble_fraction",
    "course_lib.measure.estimate.compute:pipeline_bubble_ratio",
    "course_lib.parallel.pipeline:replay",
    "course_lib.units.u12_pipeline_parallelism.run:replayed_bubble",
)
ORDER_REFERENCES = (
    "course_lib.parallel.pipeline:one_f_one_b_order",
    "course_lib.parallel.pipeline:schedule_order",
    "course_lib.parallel.pipeline:interleaved_order",
)
HOLDER_REFERENCES = ("course_lib.parallel.pipeline:stage_owner",)
BUBBLE_CASES = ((3, 3, 2), (3, 6, 3))  # (ranks p, micro-batches m, stages per rank v); one p
ORDER_CASES = ((4, 8), (3, 5), (2, 2), (4, 4), (5, 7))  # (p, m), every stage
GRADE_TIMEOUT_S = 90.0


def _launch(task: int, worker, world_size: int, *args):
    from course_lib.runtime.errors import LaunchError
    from course_lib.runtime.launch import launch

    try:
        return launch(worker, world_size, *args, timeout=GRADE_TIMEOUT_S)
    except LaunchError as exc:
        first = next(iter(exc.failures.values()), str(exc))
        fail(
            task,
            f"the run on {world_size} ranks did not finish: "
            f"{(str(first).strip().splitlines() or [''])[0]}",
        )


# --------------------------------------------------------------------------------------------
# task 1: predict the bubble of interleaved 1F1B
# --------------------------------------------------------------------------------------------
def _bubble_worker(rank, world_size, cases):
    return {(m, v): _bubble_case(rank, world_size, m, v) for _, m, v in cases}


def _bubble_case(rank, world_size, microbatches, virtual):
    import torch
    import torch.nn.functional as F

    from course_lib.measure.timing import EventLog
    from course_lib.parallel import pipeline as P

    p, v, m = world_size, virtual, microbatches
    split = P.check_pipeline(
        "interleaved", n_layers=p * v, ranks=p, microbatches=m, batch_rows=m, virtual=v
    )
    model = P.PipelineRank(P.make_stack(p * v, width=8, seq=4, heads=2), split, rank, p)
    log = EventLog(rank)
    torch.manual_seed(0)
    x, y = torch.randn(m, 4, 8), torch.randn(m, 4, 8)  # (rows, seq, width), on every rank
    P.run_schedule(
        model,
        P.schedule_order("interleaved", rank, p, m, v),
        x,
        y,
        microbatches=m,
        loss_fn=F.mse_loss,
        log=log,
    )
    return log.to_records()


def check_bubble_prediction(fn, task: int = 1) -> None:
    """Task: ``fn(stages, microbatches, virtual)`` -> the idle fraction of one step of
    interleaved 1F1B (idle time over the whole step, mean over ranks), a float. Graded at
    (p, m, v) in ``BUBBLE_CASES``, each against a real run on p ranks whose recorded order of
    F/B is replayed on ideal hardware (F = 1 unit per stage, B = 2, messages free), to 1e-9."""
    from course_lib.measure.timing import merge_event_logs
    from course_lib.units.u12_pipeline_parallelism.run import _recorded_orders, replayed_bubble

    predictions = {}
    for p, m, v in BUBBLE_CASES:
        got = run_learner(task, fn, p, m, v, forbid=BUBBLE_REFERENCES)
        if isinstance(got, bool) or not isinstance(got, numbers.Real) or not math.isfinite(got):
            fail(
                task,
                f"fn({p}, {m}, {v}) must return a finite float, got {type(got).__name__} {got!r}",
            )
        predictions[(p, m, v)] = float(got)
    p = BUBBLE_CASES[0][0]
    runs = _launch(task, _bubble_worker, p, list(BUBBLE_CASES))
    for (p, m, v), got in predictions.items():
        events = merge_event_logs([r[(m, v)] for r in runs])
        replayed = replayed_bubble(
            "interleaved", ranks=p, microbatches=m, virtual=v, orders=_recorded_orders(events, p)
        )
        if abs(got - replayed) > 1e-9:
            fail(
                task,
                f"p = {p}, m = {m}, v = {v}: the run's order replayed on ideal hardware "
                f"idles {replayed:.6f} of the step, you predicted {got:.6f}",
            )
    passed(
        task,
        "interleaved 1F1B idle fraction matches real runs replayed on ideal hardware "
        f"at (p, m, v) = {', '.join(map(str, BUBBLE_CASES))}",
    )


# --------------------------------------------------------------------------------------------
# task 2: the 1F1B order of one stage
# --------------------------------------------------------------------------------------------
def check_one_f_one_b(fn, task: int = 2) -> None:
    """Task: ``fn(stage, stages, microbatches)`` -> the 1F1B (PipeDream-Flush) order of that
    stage, a list of ("F", i) / ("B", i) tuples. Graded for every stage of each (p, m) in
    ``ORDER_CASES`` against the order that runs in the lecture."""
    from course_lib.parallel.pipeline import one_f_one_b_order

    for p, m in ORDER_CASES:
        for s in range(p):
            got = run_learner(task, fn, s, p, m, forbid=ORDER_REFERENCES)
            if not isinstance(got, (list, tuple)):
                fail(task, f"fn({s}, {p}, {m}) must return a list, got {type(got).__name__}")
            got = [tuple(a) if isinstance(a, (list, tuple)) else a for a in got]
            expected = [(a.kind, a.microbatch) for a in one_f_one_b_order(s, p, m)]
            if got != expected:
                i = next(
                    (i for i, (g, e) in enumerate(zip(got, expected)) if g != e),
                    min(len(got), len(expected)),
                )
                fail(
                    task,
                    f"stage {s} of p = {p}, m = {m}: action {i} should be "
                    f"{expected[i] if i < len(expected) else 'nothing'}, got "
                    f"{got[i] if i < len(got) else 'nothing'} (expected {len(expected)} "
                    f"actions, got {len(got)})",
                )
    passed(
        task,
        "1F1B orders match PipeDream-Flush for every stage at (p, m) = "
        f"{', '.join(map(str, ORDER_CASES))}",
    )


# --------------------------------------------------------------------------------------------
# task 3: find the bug in the placement of interleaved stages
# --------------------------------------------------------------------------------------------
def _holder_worker(rank, world_size, holder):
    import torch.nn.functional as F

    from course_lib.parallel import harness as H
    from course_lib.parallel import pipeline as P
    from course_lib.units.u12_pipeline_parallelism.run import Setup, batch_fn

    setup = Setup(n_layers=4, width=8, seq=4, rows=4)
    split = P.check_pipeline(
        "interleaved", n_layers=4, ranks=world_size, microbatches=2, batch_rows=4, virtual=2
    )
    model = P.PipelineRank(setup.model(), split, rank, world_size, owner=holder)
    order = P.schedule_order("interleaved", rank, world_size, 2, 2)

    def step_fn(mod, batch):
        return P.run_schedule(mod, order, *batch, microbatches=2, loss_fn=F.mse_loss)

    return H.parallel_run(
        model,
        lambda s: batch_fn(s, setup),
        steps=1,
        step_fn=step_fn,
        gather_fn=lambda mod, which: H.merge_across(mod.tensors(which)),
    )


def check_holder(fn, task: int = 3) -> None:
    """Task: ``fn(stage, ranks)`` -> the rank that holds virtual stage ``stage`` in the
    interleaved layout (the rank the previous stage sends its activation to). Graded on every
    stage of p = 2..4 ranks, v = 1..3, then in a real interleaved step on 2 ranks (v = 2) whose
    loss and gradients must equal one process on the full batch."""
    from course_lib.parallel import harness as H
    from course_lib.units.u12_pipeline_parallelism.run import Setup, reference

    for p in (2, 3, 4):
        for k in range(3 * p):
            got = run_learner(task, fn, k, p, forbid=HOLDER_REFERENCES)
            if isinstance(got, bool) or not isinstance(got, numbers.Integral):
                fail(
                    task, f"fn({k}, {p}) must return an int rank, got {type(got).__name__} {got!r}"
                )
            if got != k % p:
                fail(
                    task,
                    f"stage {k} with {p} ranks: the stages go round robin, so stage {k} "
                    f"lives on rank {k % p}, but your function sends its activation to "
                    f"rank {got}",
                )
    table = H.compare(
        reference(Setup(n_layers=4, width=8, seq=4, rows=4)), _launch(task, _holder_worker, 2, fn)
    )
    if not table.ok.all():
        bad = table[~table.ok].iloc[0]
        fail(
            task,
            f"interleaved step on 2 ranks: {bad['quantity']} {bad['name']} differs from "
            f"one process ({bad['problem']})",
        )
    passed(
        task,
        "stages placed round robin; the interleaved step on 2 ranks equals one process "
        "(loss, gradients, parameters)",
    )
