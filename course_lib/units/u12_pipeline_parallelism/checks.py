"""Unit 12's graded checks (solutions/12_pipeline_parallelism.ipynb, exercises/12_pipeline_parallelism.ipynb).

1. ``check_bubble_prediction`` (``checks_bubble``): the learner's formula for the idle fraction
   of GPipe when the stages have different numbers of layers (the lecture ran equal stages
   only), against real runs on 3 ranks whose recorded orders are replayed on ideal hardware
   (``pipeline.replay``);
2. ``check_replay``: the learner's replay of a schedule on ideal hardware (when each action
   starts), against ``pipeline.replay`` for GPipe, 1F1B and interleaved 1F1B;
3. ``check_holder``: the fixed V placement of v chunks of stages on ranks (ZB-V's and
   DualPipeV's for two chunks, extended to any number as torch's
   ``generate_stage_to_rank_mapping(..., style="v")`` does; the buggy one turned once only), on
   a grid of ranks and chunks, then in a real step on 2 ranks that must equal one process on the
   full batch and send only the messages a V sends (each turn a hand-off inside one rank).
The pipelines each check asks about are drawn from the grading seed (``_cases``). Each check is
split (course_lib.grading.split): ``collect_X`` runs the learner's code (task 3: also in a real
step on 2 ranks) and hands back what it produced and what was measured around it; ``judge_X``
computes what is expected (the course's GPipe on real ranks replayed on ideal hardware,
``pipeline.replay``, the V, one process on the full batch) and prints one deterministic line or
raises AssertionError("✗ task N: ...").
"""

from __future__ import annotations

import numbers
from typing import Any

from course_lib.grading.core import fail, passed, run_learner
from course_lib.grading.plain import describe, learner_value
from course_lib.grading.records import need_record, plain_record
from course_lib.grading.split import split_check
from course_lib.units.u12_pipeline_parallelism.checks_bubble import (
    BUBBLE_REFERENCES,
    _launch,
    check_bubble_prediction,
)

__all__ = [
    "check_bubble_prediction",
    "check_replay",
    "check_holder",
    "BUBBLE_REFERENCES",
    "REPLAY_REFERENCES",
    "HOLDER_REFERENCES",
]

REPLAY_REFERENCES = BUBBLE_REFERENCES
HOLDER_REFERENCES = (
    "course_lib.parallel.pipeline.rank:stage_owner",
    "course_lib.units.u12_pipeline_parallelism.checks:_v_walk",
    "torch.distributed.pipelining._utils:generate_stage_to_rank_mapping",
    "torch.distributed.pipelining._utils:generate_rank_to_stage_mapping",
)


# --------------------------------------------------------------------------------------------
# task 2: replay a schedule on ideal hardware
# --------------------------------------------------------------------------------------------
def _orders(case) -> list[list[tuple[str, int, int]]]:
    from course_lib.parallel import pipeline as P

    p, m, v = case["ranks"], case["microbatches"], case["virtual"]
    return [
        [(a.kind, a.microbatch, a.stage) for a in P.schedule_order(case["schedule"], r, p, m, v)]
        for r in range(p)
    ]


def _expected_starts(orders, layers) -> list[list[float]]:
    from course_lib.parallel import pipeline as P

    spans = P.replay(orders, P.split_layers(sum(layers), len(layers), sizes=layers))
    return [[sp["start"] for sp in spans if sp["rank"] == r] for r in range(len(orders))]


def _name(case) -> str:
    v = f", v = {case['virtual']}" if case["virtual"] > 1 else ""
    return (
        f"{case['schedule']}, p = {case['ranks']}, m = {case['microbatches']}{v}, "
        f"layers {case['layers']}"
    )


def collect_replay(fn, task: int = 2) -> list[Any]:
    """Task: ``fn(orders, layers)`` -> when each action starts on ideal hardware: a list per
    rank, one number per action of ``orders[r]`` (tuples ("F" or "B", micro-batch, stage)), where
    stage k has ``layers[k]`` layers, an F costs a stage's layers, a B twice that, messages are
    free, and an action starts once its rank has finished the one before and its input exists.
    Graded on one drawn pipeline per schedule (GPipe, 1F1B, interleaved 1F1B; uneven stages)
    against ``pipeline.replay``, to 1e-9."""
    from course_lib.units.u12_pipeline_parallelism._cases import replay_cases

    out = []
    for case in replay_cases(task):
        orders, layers = _orders(case), list(case["layers"])
        got = run_learner(
            task, fn, [list(o) for o in orders], list(layers), forbid=REPLAY_REFERENCES
        )
        out.append(learner_value(got))
    return out


def judge_replay(data: Any, task: int = 2) -> None:
    from course_lib.units.u12_pipeline_parallelism._cases import replay_cases

    cases = replay_cases(task)
    got_all = data if isinstance(data, list) and len(data) == len(cases) else [None] * len(cases)
    for case, got in zip(cases, got_all):
        orders, layers = _orders(case), list(case["layers"])
        shape = [len(o) for o in orders]
        if (
            not isinstance(got, (list, tuple))
            or [len(g) if isinstance(g, (list, tuple)) else -1 for g in got] != shape
        ):
            fail(
                task,
                f"{_name(case)}: expected a list per rank of {shape} start times, got {got!r:.120}",
            )
        want = _expected_starts(orders, layers)
        for r, (g_rank, w_rank) in enumerate(zip(got, want)):
            for i, (g, w) in enumerate(zip(g_rank, w_rank)):
                if isinstance(g, bool) or not isinstance(g, numbers.Real):
                    fail(task, f"{_name(case)}: start times must be numbers, got {g!r}")
                g = float(g)
                if not abs(g - w) <= 1e-9:  # nan is not a start time
                    kind, mb, k = orders[r][i]
                    when = (
                        "before its rank is free or its input exists"
                        if g < w
                        else "later than its rank and its input are ready"
                    )
                    fail(
                        task,
                        f"{_name(case)}: rank {r}'s action {i} ({kind}{mb} of stage {k}) "
                        f"starts at {g!r}: {when}",
                    )
    passed(
        task,
        "replayed start times match pipeline.replay for GPipe, 1F1B and interleaved 1F1B "
        "(3 drawn pipelines, uneven stages)",
    )


check_replay = split_check(collect_replay, judge_replay)


# --------------------------------------------------------------------------------------------
# task 3: find the bug in the V placement of the stages
# --------------------------------------------------------------------------------------------
def _v_walk(ranks: int, stages: int) -> list[int]:
    """The V placement as a walk over the ranks, one stage at a time: down from rank 0; at either
    end the walk stays put for one stage (the turn, a hand-off inside that rank) and then goes
    back the other way. ``[rank of stage 0, rank of stage 1, ...]``."""
    placed, rank, step = [], 0, 1
    for _ in range(stages):
        placed.append(rank)
        if 0 <= rank + step < ranks:
            rank += step
        else:
            step = -step
    return placed


def _v_order(rank: int, ranks: int, microbatches: int, stages: int, holder) -> list:
    """A schedule for any placement: the forwards of every micro-batch on this rank's stages in
    stage order, then the backwards in reverse (GPipe over the stages a rank holds; a stage
    waits only on lower stages going forward and higher ones going back, so no rank deadlocks)."""
    from course_lib.parallel.pipeline import Action

    mine = [k for k in range(stages) if holder(k, ranks) == rank]
    forward = [Action("F", i, k) for k in mine for i in range(microbatches)]
    return forward + [Action("B", i, k) for k in reversed(mine) for i in range(microbatches)]


def _v_messages(placed: list[int], microbatches: int) -> int:
    """Point-to-point messages of one step with stage k on rank ``placed[k]``: an activation
    forward and its gradient back across each boundary whose two stages sit on different ranks,
    per micro-batch."""
    crossings = sum(a != b for a, b in zip(placed, placed[1:]))
    return 2 * microbatches * crossings


def _holder_setup(case):
    from course_lib.units.u12_pipeline_parallelism.run import Setup

    return Setup(n_layers=2 * case["virtual"], width=8, seq=4, rows=4)


def _holder_worker(rank, world_size, holder, case):
    import torch.nn.functional as F

    from course_lib.measure.comm import CommMeter
    from course_lib.parallel import harness as H
    from course_lib.parallel import pipeline as P
    from course_lib.units.u12_pipeline_parallelism.run import batch_fn

    setup, v, m = _holder_setup(case), case["virtual"], case["microbatches"]
    split = P.check_pipeline(
        "interleaved",  # v stages per rank: the split is the same, the placement is the learner's
        n_layers=setup["n_layers"],
        ranks=world_size,
        microbatches=m,
        batch_rows=setup["rows"],
        virtual=v,
    )
    model = P.PipelineRank(setup.model(), split, rank, world_size, owner=holder)
    order = _v_order(rank, world_size, m, len(split), holder)
    comm = CommMeter(dispatch=False)  # the messages this rank sends (a hand-off inside it is none)

    def step_fn(mod, batch):
        with comm:
            return P.run_schedule(mod, order, *batch, microbatches=m, loss_fn=F.mse_loss)

    record = H.parallel_run(
        model,
        lambda s: batch_fn(s, setup),
        steps=1,
        step_fn=step_fn,
        gather_fn=lambda mod, which: H.merge_across(mod.tensors(which)),
    )
    return record, comm.calls.get("isend", 0)


_GRID = (2, 3, 4)  #: the ranks the placement is asked about, each with 4 chunks


def collect_holder(fn, task: int = 3) -> dict:
    """Task: ``fn(stage, ranks)`` -> the rank that holds stage ``stage`` in the V placement (the
    rank the previous stage sends its activation to). Graded on every stage of p = 2..4 ranks
    and v = 1..4 chunks, then in a real step on 2 ranks (v and m drawn) placed and routed by
    ``fn``: its loss and gradients must equal one process on the full batch, and the ranks must
    send only the messages a V sends."""
    from course_lib.units.u12_pipeline_parallelism._cases import holder_case

    grid = {
        p: [
            learner_value(run_learner(task, fn, k, p, forbid=HOLDER_REFERENCES))
            for k in range(4 * p)
        ]
        for p in _GRID
    }
    step = None
    if all(type(r) is int and 0 <= r < 2 for r in grid[2]):  # a placement on 2 ranks: run it
        runs = _launch(task, _holder_worker, 2, fn, holder_case(task))
        step = {"records": [plain_record(rec) for rec, _ in runs], "sent": [n for _, n in runs]}
    return {"grid": grid, "step": step}


def _judge_grid(task: int, grid: Any) -> None:
    """Every stage of p = 2..4 ranks and 4 chunks placed on the V, in order."""
    for p in _GRID:
        v_shape = _v_walk(p, 4 * p)
        answers = grid.get(p) if isinstance(grid, dict) else None
        if not isinstance(answers, list) or len(answers) != 4 * p:
            fail(task, f"the run handed back no ranks for the {4 * p} stages on {p} ranks")
        for k, got in enumerate(answers):
            if isinstance(got, bool) or not isinstance(got, numbers.Integral):
                fail(task, f"fn({k}, {p}) must return an int rank, got {describe(got)}")
            got = int(got)
            if not 0 <= got < p:
                fail(task, f"stage {k} with {p} ranks: rank {got} does not exist (0..{p - 1})")
            if got != v_shape[k]:
                fail(
                    task,
                    f"stage {k} with {p} ranks (chunk {k // p}, counting from 0): your function "
                    f"places it on rank {got}, off the V",
                )


def expect_holder(task: int = 3) -> Any:
    """One process on the full batch of the drawn V step: what the 2 ranks must equal (the
    grade computes it while the learner's side runs)."""
    from course_lib.units.u12_pipeline_parallelism._cases import holder_case
    from course_lib.units.u12_pipeline_parallelism.run import reference

    return reference(_holder_setup(holder_case(task)))


def judge_holder(data: Any, task: int = 3, expected: Any = None) -> None:
    from course_lib.parallel import harness as H
    from course_lib.units.u12_pipeline_parallelism._cases import holder_case

    _judge_grid(task, data.get("grid") if isinstance(data, dict) else None)
    case = holder_case(task)
    v, m = case["virtual"], case["microbatches"]
    where = f"V step on 2 ranks, v = {v}, m = {m}"
    step = data.get("step") if isinstance(data, dict) else None
    records, sent = (step.get("records"), step.get("sent")) if isinstance(step, dict) else ([], [])
    if not (isinstance(records, list) and len(records) == 2 and isinstance(sent, list)):
        fail(task, f"{where}: the run handed back no record of its step")
    table = H.compare(
        expected if expected is not None else expect_holder(task),
        [need_record(task, r, where, steps="its step") for r in records],
    )
    if not table.ok.all():
        bad = table[~table.ok].iloc[0]
        fail(
            task,
            f"{where}: {bad['quantity']} {bad['name']} differs from one process ({bad['problem']})",
        )
    if not (len(sent) == 2 and all(type(n) is int for n in sent)):
        fail(task, f"{where}: the run handed back no count of the messages its ranks sent")
    total, expected = sum(sent), _v_messages(_v_walk(2, 2 * v), m)
    if total != expected:
        fail(task, f"{where}: the ranks sent {total} messages; a V sends {expected}")
    passed(
        task,
        "stages placed in a V on 2-4 ranks and 1-4 chunks; the step on 2 ranks equals one "
        "process (loss, gradients, parameters) and sends only the V's messages",
    )


check_holder = split_check(collect_holder, judge_holder, expect=expect_holder)
