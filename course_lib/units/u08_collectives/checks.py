"""Checks for the exercises of unit 08, collectives (solutions/08_collectives.ipynb).

The learner's functions are launched on 2, 3 and 4 real gloo ranks with course_lib.launch and
compared with torch.distributed (values) and with course_lib.measure.estimate (bytes: the payloads
the learner's code hands to send/isend, counted by a CallLog from the calls it makes; for
point-to-point calls that is what the model counts too, the wire adds only gloo's headers). Each check prints one deterministic line or raises AssertionError("✗ task N: ...").
The sizes of task 3, the delays of task 4 and a model size and GPU count of task 6 are drawn
from the grading seed (:func:`course_lib.grading.seeds.case_rng`).

Every check is split in two (:mod:`course_lib.grading.split`): ``collect_X`` runs the learner's
code (inside the ranks: the tensors it left and the calls it made; no reference runs there) and
``judge_X`` computes what is expected in one process from the seeded inputs, or launches the
course's reference on ranks itself, and gives the verdict.
"""

from __future__ import annotations

from typing import Any

from course_lib.grading.calls import need_runs
from course_lib.grading.core import fail, passed, run_learner
from course_lib.grading.plain import describe, learner_number
from course_lib.grading.seeds import case_rng
from course_lib.grading.split import split_check
from course_lib.units.u08_collectives.checks_bytes import (  # noqa: F401 (re-exported)
    SCALE_CASES,
    SCALE_SCHEMES,
    check_composite_bytes,
    check_scale_bytes,
)
from course_lib.units.u08_collectives.checks_ranks import (
    WORLD_SIZES,
    _guarded,
    _launch_learner,
    _name,
    _ring_worker,
    check_ring_bytes,
    check_ring_cases,
    draw_ring_case,
    learner_name,
)

UNIT = "u08_collectives"


# --------------------------------------------------------------------------------------------
# tasks 1 and 2: the rings
# --------------------------------------------------------------------------------------------
def _collect_ring(fn, task: int, gather: bool) -> dict[str, Any]:
    if not callable(fn):
        fail(task, f"expected a function, got {type(fn).__name__} {fn!r}")
    case = draw_ring_case(case_rng(task, UNIT))
    runs = [_launch_learner(task, _ring_worker, n, fn, gather, *case) for n in WORLD_SIZES]
    return {"name": _name(fn), "runs": runs}


def collect_ring_all_reduce(fn, task: int = 1) -> dict[str, Any]:
    """Task: ring all-reduce from send/recv. ``fn(tensor)`` sums ``tensor`` over ranks in place.

    Graded on 2, 3 and 4 ranks, on sizes drawn from the grading seed (one element, a small and a
    large size no N divides: :func:`draw_ring_case`), float32 and float64, against
    ``dist.all_reduce`` (within the summation-order bound 2(N-1) eps sum|x|), then on a drawn size
    divisible by N: every rank must send exactly estimate.ring_allreduce_bytes_sent(S, N) bytes
    through point-to-point calls only.
    """
    return _collect_ring(fn, task, gather=False)


def _judge_ring(data: Any, task: int, gather: bool) -> None:
    from course_lib.measure import estimate

    case = draw_ring_case(case_rng(task, UNIT))
    name = learner_name(data)
    what = "the gathered tensor" if gather else "the all-reduced tensor"
    formula = "(N-1)/N * S_out" if gather else "2(N-1)/N * S"
    for world_size, results in zip(WORLD_SIZES, need_runs(task, data, WORLD_SIZES)):
        check_ring_cases(task, world_size, results, case, what, gather)
        size = world_size * case[2] * 4
        bytes_sent = estimate.allgather_bytes_sent if gather else estimate.ring_allreduce_bytes_sent
        check_ring_bytes(
            task, name, world_size, results, size, bytes_sent(size, world_size), formula
        )


def judge_ring_all_reduce(data: Any, task: int = 1) -> None:
    _judge_ring(data, task, gather=False)
    passed(
        task,
        "ring all-reduce matches dist.all_reduce on 2, 3 and 4 ranks (sizes that do not split "
        "evenly, float32 and float64) and each rank sends 2(N-1)/N * S bytes",
    )


check_ring_all_reduce = split_check(collect_ring_all_reduce, judge_ring_all_reduce)


def collect_ring_all_gather(fn, task: int = 2) -> dict[str, Any]:
    """Task: ring all-gather. ``fn(output, input)``: rank r's ``input`` (k elements) lands in
    chunk r of every rank's ``output`` (N * k elements).

    Graded on 2, 3 and 4 ranks, k drawn as in task 1 (:func:`draw_ring_case`), float32 and
    float64, bitwise against
    ``dist.all_gather_single`` (copies, no arithmetic), then bytes: each rank sends exactly
    estimate.allgather_bytes_sent(S_out, N) = (N-1)/N * S_out through point-to-point calls.
    """
    return _collect_ring(fn, task, gather=True)


def judge_ring_all_gather(data: Any, task: int = 2) -> None:
    _judge_ring(data, task, gather=True)
    passed(
        task,
        "ring all-gather equals dist.all_gather_single bit for bit on 2, 3 and 4 ranks "
        "and each rank sends (N-1)/N * S_out bytes",
    )


check_ring_all_gather = split_check(collect_ring_all_gather, judge_ring_all_gather)


# --------------------------------------------------------------------------------------------
# task 4: predict before you measure -- late ranks and an all-reduce
# --------------------------------------------------------------------------------------------
#: the late ranks of task 4 under the default seed: rank r computes STRAGGLER_SLEEPS[r] seconds
#: before the all-reduce (:func:`straggler_sleeps` draws them per seed)
STRAGGLER_SLEEPS = (0.0, 0.3, 0.1, 0.0)


def straggler_sleeps(task: int = 4) -> tuple[float, ...]:
    """Delays of 4 ranks drawn from the grading seed, 0.05 s apart at least: one rank on time,
    one straggler 0.2-0.4 s late, two in between, in a drawn order (never the lecture's)."""
    rng = case_rng(task, UNIT)
    while True:
        late = rng.choice((0.2, 0.25, 0.3, 0.35, 0.4))
        mids = rng.sample([x / 20 for x in range(0, round(late * 20))], 2)
        sleeps = [0.0, late, *mids]
        rng.shuffle(sleeps)
        if sleeps != [0.0, 0.2, 0.0, 0.0]:
            return tuple(sleeps)


STRAGGLER_TOL_S = 0.1  # scheduling on a shared 2-core machine: tens of ms of jitter
#: measuring is not predicting: the lecture's run of the same experiment is out of reach
_STRAGGLER_REFERENCES = ("course_lib.units.u08_collectives.run_patterns:straggler",)


def _measure_straggler(sleeps) -> list[float]:
    from course_lib.units.u08_collectives.run_patterns import straggler

    return straggler(list(sleeps))["in_all_reduce_s"].tolist()


def collect_straggler_prediction(predict_wait_s, task: int = 4) -> dict[str, Any]:
    """Task: ``predict_wait_s(sleeps)`` returns, for each rank, the seconds it spends inside one
    all-reduce when rank r first computes ``sleeps[r]`` seconds. The check predicts first, then
    runs it on 4 real ranks with STRAGGLER_SLEEPS and compares every rank within 0.1 s. A shared
    machine can delay one run: a miss is measured again (up to 3 runs)."""
    sleeps = straggler_sleeps(task)
    got = run_learner(task, predict_wait_s, list(sleeps), forbid=_STRAGGLER_REFERENCES)
    if isinstance(got, (list, tuple)):
        got = [learner_number(v, builtin_only=True) for v in got]  # as checks_bytes
    return {"wait_s": got}


def judge_straggler_prediction(data: Any, task: int = 4) -> None:
    sleeps = straggler_sleeps(task)
    got = data.get("wait_s") if isinstance(data, dict) else None
    if (
        not isinstance(got, (list, tuple))
        or len(got) != len(sleeps)
        or any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in got)
    ):
        fail(
            task,
            f"expected a list of {len(sleeps)} numbers of seconds (one per rank), got {got!r}",
        )
    misses = []
    for _ in range(3):
        measured = _measure_straggler(sleeps)
        worst = max(range(len(got)), key=lambda r: abs(got[r] - measured[r]))
        if abs(got[worst] - measured[worst]) <= STRAGGLER_TOL_S:
            passed(
                task,
                f"every rank's time inside the all-reduce is within {STRAGGLER_TOL_S:g} s of "
                "the prediction, on 4 ranks with delays the lecture did not run",
            )
            return
        misses.append(
            f"rank {worst}: predicted {got[worst]:.3f} s, measured {measured[worst]:.3f} s"
        )
    fail(
        task,
        f"sleeps {list(sleeps)}, in 3 runs: {'; '.join(misses)} (within "
        f"{STRAGGLER_TOL_S:g} s passes)",
    )


check_straggler_prediction = split_check(collect_straggler_prediction, judge_straggler_prediction)


# --------------------------------------------------------------------------------------------
# task 5: find the bug -- all-gather where an all-reduce was needed
# --------------------------------------------------------------------------------------------
def buggy_average_gradients(grad):
    """The gradient averaging of task 5, with its one mistake (shown to the learner)."""
    import torch
    import torch.distributed as dist

    world = dist.get_world_size()
    parts = [torch.empty_like(grad) for _ in range(world)]
    dist.all_gather(parts, grad)
    return torch.cat(parts) / world


AVERAGE_WORLD_SIZES = (2, 3)


def _average_case(task: int) -> tuple[tuple[tuple[int, ...], ...], int]:
    """Task 5's gradient shapes (a vector and a matrix) and data seed, drawn from the grading seed."""
    rng = case_rng(task, UNIT)
    shapes = ((rng.randint(2, 9),), (rng.randint(2, 6), rng.randint(2, 6)))
    return shapes, rng.randrange(2**31)


def _gradient(seed: int, rank: int, shape: tuple[int, ...]) -> Any:
    """Rank ``rank``'s gradient of ``shape``, float64, the same wherever it is made."""
    import torch

    gen = torch.Generator().manual_seed(seed + 11 * rank + len(shape))
    return torch.randn(shape, generator=gen, dtype=torch.float64)


def _average_worker(
    rank: int,
    world_size: int,
    fn,
    shapes: tuple[tuple[int, ...], ...] = ((2,), (3, 5)),
    seed: int = 0,
) -> dict:
    """What ``fn`` returned for each shape: a CPU copy of a tensor, or the name of the type it
    returned instead."""
    import torch

    outs: list[Any] = []
    for shape in shapes:
        ok, err = _guarded(lambda g: outs.append(fn(g)), _gradient(seed, rank, shape))
        if not ok:
            return {"error": err}
        out = outs.pop()
        if isinstance(out, torch.Tensor):
            outs.append(out.detach().to("cpu").as_subclass(torch.Tensor).clone())
        else:
            outs.append(type(out).__name__)
    return {"outs": outs}


def collect_fixed_average(fn, task: int = 5) -> dict[str, Any]:
    """Task: ``fn(grad)`` returns the mean of ``grad`` over all ranks, with grad's shape (what
    buggy_average_gradients should have returned). Run on 2 and 3 real ranks, on a vector and a
    matrix whose shapes and values are drawn from the grading seed, float64, against the mean
    computed from every rank's gradient (within 1e-12)."""
    if not callable(fn):
        fail(task, f"expected a function, got {type(fn).__name__} {fn!r}")
    shapes, seed = _average_case(task)
    return {
        "runs": [
            _launch_learner(task, _average_worker, n, fn, shapes, seed) for n in AVERAGE_WORLD_SIZES
        ]
    }


def _average_problem(out: Any, shape: tuple[int, ...], want: Any) -> str:
    """What is wrong with one rank's returned average ("" if nothing)."""
    import torch

    if isinstance(out, str):
        return f"returned {out[:100]}, not a tensor"
    if not isinstance(out, torch.Tensor):
        return f"returned {describe(out)}, not a tensor"
    if tuple(out.shape) != shape:
        return f"returned shape {tuple(out.shape)}, expected the gradient's {shape}"
    err_max = float((out.double() - want).abs().max())
    return "" if err_max <= 1e-12 else f"max abs difference from the mean {err_max:.3g}"


def judge_fixed_average(data: Any, task: int = 5) -> None:
    import torch

    shapes, seed = _average_case(task)
    runs = need_runs(task, data, AVERAGE_WORLD_SIZES)
    for world_size, results in zip(AVERAGE_WORLD_SIZES, runs):
        wanted = [
            torch.stack([_gradient(seed, r, shape) for r in range(world_size)]).mean(0)
            for shape in shapes
        ]
        for rank, res in enumerate(results):
            outs = res.get("outs")
            if not isinstance(outs, list) or len(outs) != len(shapes):
                fail(task, f"rank {rank} of {world_size}: the run handed back no average per shape")
            for shape, want, out in zip(shapes, wanted, outs):
                why = _average_problem(out, shape, want)
                if why:
                    fail(
                        task,
                        f"rank {rank} of {world_size}, gradient of shape {shape}: {why}",
                    )
    passed(task, "every rank holds the mean gradient, in the gradient's shape, on 2 and 3 ranks")


check_fixed_average = split_check(collect_fixed_average, judge_fixed_average)
