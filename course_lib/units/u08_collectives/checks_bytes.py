"""Unit 08's byte-prediction checks (tasks 3 and 6 of solutions/08_collectives.ipynb), re-exported
by :mod:`.checks`: the learner predicts, the judge compares with estimate and, for task 3, with
the bytes the course's rings send on real ranks (a reference the judge launches itself)."""

from __future__ import annotations

from typing import Any

from course_lib.grading.core import fail, fmt_int, passed, run_learner
from course_lib.grading.plain import learner_number
from course_lib.grading.seeds import case_rng
from course_lib.grading.split import split_check
from course_lib.units.u08_collectives.checks_ranks import (
    _BYTES_REFERENCES,
    GRADE_TIMEOUT_S,
    _composite_worker,
    _name,
    learner_name,
)

UNIT = "u08_collectives"


def _numbers(task: int, data: Any, key: str, count: int) -> list[Any]:
    """``data[key]``, a list of ``count`` answers (of any type: the judge reads each)."""
    got = data.get(key) if isinstance(data, dict) else None
    if not isinstance(got, list) or len(got) != count:
        fail(task, f"the run handed back no {count} answers under {key!r}")
    return got


# --------------------------------------------------------------------------------------------
# task 3: predict the bytes of reduce-scatter + all-gather
# --------------------------------------------------------------------------------------------
def _composite_cases(task: int) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(S, N) cases checked against estimate, then (N, numel) runs measured on ranks."""
    rng = case_rng(task, UNIT)
    odd = rng.choice((3, 5, 6, 7))
    cases = [
        (4 * rng.randint(256, 4096), 2),
        (4 * rng.randint(256, 4096), 4),
        (odd * 4 * rng.randint(256, 4096), odd),  # N not a power of two
        (2 ** rng.randint(20, 26), rng.choice((8, 16, 32))),
        (2 ** rng.randint(28, 32), rng.choice((64, 128, 256))),
        (4 * rng.randint(1, 2000), 1),  # one rank sends nothing
    ]
    rng.shuffle(cases)
    return cases, [(2, 2 * rng.randint(256, 2048)), (4, 4 * rng.randint(256, 2048))]


def collect_composite_bytes(predict: Any, task: int = 3) -> dict[str, Any]:
    """Task: predict the bytes one rank sends in an all-reduce done as ring reduce-scatter +
    ring all-gather. ``predict(size_bytes, world_size)`` returns a number of bytes.

    Graded against estimate (reduce_scatter_bytes_sent + allgather_bytes_sent) on several
    (S, N), and against the payloads CommMeter counts in the from-scratch rings' send calls on 2
    and 4 ranks.
    """
    cases, runs = _composite_cases(task)

    def ask(size: int, n: int) -> Any:
        # an int or float subclass crosses as the plain number it is (numpy's float64 passed
        # these checks before they were split and still does; numpy's int64 did not, nor does)
        got = run_learner(task, predict, size, n, forbid=_BYTES_REFERENCES)
        return learner_number(got, builtin_only=True)

    return {
        "name": _name(predict),
        "cases": [ask(size, n) for size, n in cases],
        "runs": [ask(numel * 4, n) for n, numel in runs],
    }


def judge_composite_bytes(data: Any, task: int = 3) -> None:
    from course_lib.measure import estimate
    from course_lib.runtime.errors import LaunchError
    from course_lib.runtime.launch import launch

    cases, runs = _composite_cases(task)
    name = learner_name(data)
    for (size, n), got in zip(cases, _numbers(task, data, "cases", len(cases))):
        expected = estimate.reduce_scatter_bytes_sent(size, n) + estimate.allgather_bytes_sent(
            size, n
        )
        if not isinstance(got, (int, float)) or isinstance(got, bool):
            fail(task, f"{name}({size}, {n}) must return a number of bytes, got {got!r}")
        if not abs(got - expected) <= 1e-9 * max(1.0, expected):
            fail(
                task,
                f"for S = {fmt_int(size)} B on N = {n} ranks: {got!r} B per rank is not what "
                "reduce-scatter + all-gather send",
            )
    for (n, numel), predicted in zip(runs, _numbers(task, data, "runs", len(runs))):
        try:
            measured = launch(_composite_worker, n, numel, timeout=GRADE_TIMEOUT_S)
        except LaunchError as exc:  # not the learner's fault, but say so clearly
            fail(
                task,
                f"could not measure the reference run on {n} ranks: {str(exc).splitlines()[0]}",
            )
        for rank, got in enumerate(measured):
            if type(predicted) not in (int, float) or got != predicted:
                fail(
                    task,
                    f"rank {rank} of {n}, S = {fmt_int(numel * 4)} B: your prediction "
                    f"{predicted!r} is not what CommMeter counted in the send calls",
                )
    passed(
        task,
        f"predictions match estimate on {len(cases)} cases and CommMeter on 2 and 4 ranks: "
        "reduce-scatter + all-gather sends 2(N-1)/N * S per rank, the ring all-reduce's bytes",
    )


check_composite_bytes = split_check(collect_composite_bytes, judge_composite_bytes)


# --------------------------------------------------------------------------------------------
# task 6: scale it up -- bytes per GPU per step at 7B and 70B
# --------------------------------------------------------------------------------------------
SCALE_SCHEMES = ("all_reduce", "zero3", "parameter_server")
SCALE_CASES = tuple((n, w) for n in (7_000_000_000, 70_000_000_000) for w in (8, 64))
_SCALE_REFERENCES = _BYTES_REFERENCES + (
    "course_lib.measure.estimate.communication:reduce_broadcast_bytes_sent",
)


def _scale_expected(n_params: int, world_size: int, scheme: str) -> float:
    from course_lib.measure import estimate

    s = 2 * n_params  # bf16 gradients (and, for ZeRO-3, bf16 parameters): 2 bytes each
    if scheme == "all_reduce":
        return estimate.ring_allreduce_bytes_sent(s, world_size)
    if scheme == "zero3":  # reduce-scatter the gradients, all-gather the parameters twice
        return estimate.reduce_scatter_bytes_sent(
            s, world_size
        ) + 2 * estimate.allgather_bytes_sent(s, world_size)
    return estimate.reduce_broadcast_bytes_sent(s, world_size, root=True)


def _scale_cases(task: int) -> list[tuple[int, int, str]]:
    rng = case_rng(task, UNIT)
    drawn = (rng.randint(1, 500) * 10**9, rng.choice((2, 4, 16, 32, 128, 256, 512)))
    return [(n, ws, scheme) for n, ws in (*SCALE_CASES, drawn) for scheme in SCALE_SCHEMES]


def collect_scale_bytes(bytes_per_step: Any, task: int = 6) -> list[Any]:
    """Task: ``bytes_per_step(n_params, world_size, scheme)``: the bytes the busiest GPU sends in
    one step, bf16, for scheme "all_reduce" (ring all-reduce of the gradients), "zero3"
    (ring reduce-scatter of the gradients + ring all-gather of the parameters before forward and
    again before backward) and "parameter_server" (rank 0 collects and sends back everything).
    Graded for 7B and 70B on 8 and 64 GPUs, and a size and GPU count drawn from the grading
    seed, against estimate (rtol 1e-9)."""
    return [
        learner_number(
            run_learner(task, bytes_per_step, n, ws, scheme, forbid=_SCALE_REFERENCES),
            builtin_only=True,  # as task 3's answers
        )
        for n, ws, scheme in _scale_cases(task)
    ]


def judge_scale_bytes(data: Any, task: int = 6) -> None:
    cases = _scale_cases(task)
    if not isinstance(data, list) or len(data) != len(cases):
        fail(task, f"the run handed back no {len(cases)} answers")
    for (n_params, ws, scheme), got in zip(cases, data):
        expected = _scale_expected(n_params, ws, scheme)
        if isinstance(got, bool) or not isinstance(got, (int, float)):
            fail(
                task,
                f"{n_params:.0e} params, {ws} GPUs, {scheme}: expected a number of bytes, got {got!r}",
            )
        if not abs(got - expected) <= 1e-9 * expected:
            fail(
                task,
                f"{n_params:.0e} params, {ws} GPUs, {scheme}: {got / 1e9:,.4g} GB per step is "
                "not what the busiest GPU sends",
            )
    a = _scale_expected(70_000_000_000, 64, "all_reduce") / 1e9
    z = _scale_expected(70_000_000_000, 64, "zero3") / 1e9
    p = _scale_expected(70_000_000_000, 64, "parameter_server") / 1e9
    passed(
        task,
        f"bytes per step match estimate for 7B and 70B on 8 and 64 GPUs and an unseen size (70B on 64: "
        f"all-reduce {a:,.0f} GB, ZeRO-3 {z:,.0f} GB, parameter server {p:,.0f} GB)",
    )


check_scale_bytes = split_check(collect_scale_bytes, judge_scale_bytes)
