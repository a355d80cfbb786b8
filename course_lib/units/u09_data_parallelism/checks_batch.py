"""Unit 09's tasks 3 and 4 (re-exported by :mod:`.checks`): the batch arithmetic, and the bytes a
rank sends per optimizer step. The learner's side only asks the learner's function; the judge
knows the answers (task 3) or measures the course's DataParallel on real ranks itself (task 4)."""

from __future__ import annotations

from typing import Any

from course_lib.grading.core import fail, fmt_int, launch_learner, passed, run_learner
from course_lib.grading.plain import describe, learner_number
from course_lib.grading.split import split_check

UNIT = "u09_data_parallelism"
GRADE_TIMEOUT_S = 60.0
HEADER_ALLOWANCE = 1024  # B per all-reduce and per peer: gloo's message headers (576 B measured)


# --------------------------------------------------------------------------------------------
# task 3: the batch arithmetic
# --------------------------------------------------------------------------------------------
def batch_cases(task: int) -> list[tuple[int, int, int, int | None]]:
    """Six (train_batch_size, micro_batch_per_gpu, world_size, steps or None), drawn from the
    grading seed around the lecture's 32 = 4 x 2 x 4: three that fit (one on a single GPU, one
    in a single step), one off by a remainder, one smaller than a single micro-step."""
    from course_lib.grading.seeds import case_rng

    rng = case_rng(task, UNIT)
    micro, gpus = (1, 2, 4, 8, 16), (2, 4, 8, 16, 32, 64, 128)
    cases: list[tuple[int, int, int, int | None]] = [(32, 4, 2, 4)]
    for n, steps in (
        (1, rng.randint(2, 16)),
        (rng.choice(gpus), 1),
        (rng.choice(gpus), rng.randint(2, 16)),
    ):
        m = rng.choice(micro)
        cases.append((m * n * steps, m, n, steps))
    m, n = rng.choice(micro[1:]), rng.choice(gpus)
    cases.append((m * n * rng.randint(2, 16) + rng.randint(1, m * n - 1), m, n, None))
    m, n = rng.choice(micro[1:]), rng.choice(gpus)
    cases.append((m * n // 2, m, n, None))
    rng.shuffle(cases)
    return cases


_STEPS_REFERENCES = ["course_lib.units.u09_data_parallelism.run_scale:accumulation_steps_for"]


def collect_accumulation_steps(fn: Any, task: int = 3) -> list[dict[str, Any]]:
    """Task: ``fn(train_batch_size, micro_batch_per_gpu, world_size)`` returns the int number of
    accumulation steps that makes train = micro x steps x world hold, and raises ValueError
    when none does."""
    out: list[dict[str, Any]] = []
    for b, m, n, _ in batch_cases(task):
        try:
            got = run_learner(task, fn, b, m, n, forbid=_STEPS_REFERENCES)
        except AssertionError as exc:
            if "ValueError" not in str(exc):
                raise
            out.append({"raised": (str(exc).splitlines() or [""])[0][:500]})
            continue
        out.append({"returned": learner_number(got, builtin_only=True)})
    return out


def judge_accumulation_steps(data: Any, task: int = 3) -> None:
    cases = batch_cases(task)
    if not (
        isinstance(data, list)
        and len(data) == len(cases)
        and all(isinstance(d, dict) and len(d) == 1 for d in data)
        and all(
            isinstance(d.get("raised", ""), str) and set(d) <= {"raised", "returned"} for d in data
        )
    ):
        fail(task, f"the run handed back no answers for the {len(cases)} configs")
    for (b, m, n, steps), outcome in zip(cases, data):
        if steps is None:
            if "raised" in outcome:
                continue
            fail(
                task,
                f"train {b}, micro {m}, {n} GPUs: you returned {outcome['returned']!r}, but no "
                "whole number of steps fits: raise ValueError",
            )
        if "raised" in outcome:  # the learner's ValueError where a number of steps fits
            fail(task, outcome["raised"].removeprefix(f"✗ task {task}: "))
        got = outcome["returned"]
        if isinstance(got, bool) or not isinstance(got, int):
            fail(task, f"train {b}, micro {m}, {n} GPUs: expected an int, got {describe(got)}")
        if got != steps:
            fail(
                task,
                f"train {b}, micro {m}, {n} GPUs: you returned {got} accumulation steps: "
                f"{m} x {got} x {n} = {m * got * n} rows per step, not {b}",
            )
    passed(task, f"accumulation steps right in {len(cases)} configs, including 32 = 4 x 2 x 4")


check_accumulation_steps = split_check(collect_accumulation_steps, judge_accumulation_steps)


# --------------------------------------------------------------------------------------------
# task 4: bytes per step
# --------------------------------------------------------------------------------------------
#: (world size, micro-steps) measured for task 4
BYTE_CASES = ((2, 1), (2, 4), (4, 4))
#: hidden widths task 4's model is drawn from (the lecture measured 64)
BYTE_WIDTHS = tuple(w for w in range(40, 97, 4) if w != 64)
_BYTES_REFERENCES = [
    f"course_lib.measure.estimate.communication:{f}"
    for f in ("ring_allreduce_bytes_sent", "allreduce_bytes_sent", "collective_bytes_sent")
]


def _byte_runs() -> list[tuple[int, list[int]]]:
    """(world size, its micro-step counts), in the order they are measured and asked."""
    return [(n, [k for m, k in BYTE_CASES if m == n]) for n in sorted({n for n, _ in BYTE_CASES})]


def _width(task: int) -> int:
    from course_lib.grading.seeds import case_rng

    return case_rng(task, UNIT).choice(BYTE_WIDTHS)


def _bytes_worker(
    rank: int, world_size: int, micro_list: list[int], width: int
) -> dict[int, dict[str, Any]]:
    """The judge's measurement: the course's DataParallel, ``k`` micro-steps with no_sync on all
    but the last, counted by CommMeter (bytes on the wire, modelled bytes, calls)."""
    import contextlib

    import torch

    from course_lib.measure.comm import CommMeter
    from course_lib.parallel import harness as H
    from course_lib.parallel.ddp import DataParallel
    from course_lib.units.u09_data_parallelism.run import batch_fn, model_fn

    out = {}
    for k in micro_list:
        model = DataParallel(model_fn(width=width, dtype=torch.float32), bucket_cap_mb=25.0)
        x, y = H.shard_batch(
            batch_fn(0, rows=8 * k * world_size, dtype=torch.float32), rank, world_size
        )
        with CommMeter(dispatch=False) as meter:
            for i, batch in enumerate(zip(x.chunk(k), y.chunk(k))):
                with model.no_sync() if i < k - 1 else contextlib.nullcontext():
                    (H.mse_loss(model, batch) / k).backward()
        out[k] = {
            "wire": meter.wire_bytes_sent,
            "model": meter.model_bytes_sent,
            "calls": meter.calls.get("all_reduce", 0),
            "n_params": sum(p.numel() for p in model.parameters()),
        }
    return out


def collect_bytes_prediction(fn: Any, task: int = 4) -> list[Any]:
    """Task: ``fn(n_params, dtype_bytes, world_size, micro_steps)`` predicts the int bytes each
    rank sends per optimizer step (a ring all-reduce of the gradients; ``no_sync`` on all
    micro-steps but the last), checked against the bytes each rank wrote to its sockets in
    real runs (gloo's message headers, up to 1 KiB per call and peer, allowed) of a model of
    drawn width."""
    import torch

    from course_lib.units.u09_data_parallelism.run import model_fn

    model = model_fn(width=_width(task), dtype=torch.float32)
    n_params = sum(p.numel() for p in model.parameters())
    return [
        learner_number(
            run_learner(task, fn, n_params, 4, n, k, forbid=_BYTES_REFERENCES), builtin_only=True
        )
        for n, ks in _byte_runs()
        for k in ks
    ]


def judge_bytes_prediction(data: Any, task: int = 4) -> None:
    width = _width(task)
    runs = [(n, k) for n, ks in _byte_runs() for k in ks]
    if not isinstance(data, list) or len(data) != len(runs):
        fail(task, f"the run handed back no {len(runs)} predictions")
    measured: dict[tuple[int, int], list[Any]] = {}
    for n, ks in _byte_runs():
        for res in launch_learner(task, _bytes_worker, n, ks, width, timeout=GRADE_TIMEOUT_S):
            for k in ks:
                measured.setdefault((n, k), []).append(res[k])
    for (n, k), got in zip(runs, data):
        ranks = measured[(n, k)]
        n_params = ranks[0]["n_params"]
        if isinstance(got, bool) or not isinstance(got, int):
            fail(task, f"expected an int number of bytes, got {describe(got)}")
        for rank, r in enumerate(ranks):
            seen = r["wire"] if r["wire"] is not None else r["model"]
            slack = r["calls"] * HEADER_ALLOWANCE * (n - 1) if r["wire"] is not None else 0
            if not 0 <= seen - got <= slack:
                fail(
                    task,
                    f"{fmt_int(n_params)} float32 parameters, {n} ranks, {k} micro-steps: "
                    f"you predicted {fmt_int(got)} B; rank {rank} sent "
                    f"{'more' if seen > got else 'less'} ({r['calls']} all-reduce call(s))",
                )
    passed(
        task,
        f"bytes per optimizer step predicted for {len(measured)} measured runs "
        "(2 and 4 ranks, 1 and 4 micro-steps)",
    )


check_bytes_prediction = split_check(collect_bytes_prediction, judge_bytes_prediction)
