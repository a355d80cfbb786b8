"""Checks for the exercises of unit 05 (solutions/05_cpu_offload.ipynb).

Task 1 (predict, graded against a measurement, then applied to a layout the lecture does not
print): ``predict_step_time(parts, overlap, micro_batches)`` from the parts of an offloaded step
(seconds: ``compute`` and ``to_host`` per micro-batch, ``store_read``, ``host_adam``,
``store_write``, ``to_device`` per step), in ZeRO-Offload's layout where each micro-batch's
gradients cross to the host (Ren et al. 2021). With one micro-batch and ``overlap=False`` it is
compared with measured steps, timed by their own clock around the whole step: the median over
steps of prediction / measurement must lie within 1 +- ``STEP_RTOL`` (the parts are timed inside
the same step, so the gap is the few microseconds between timers; a preempted step is an outlier
the median ignores). Then, on steps of 2 to 32 micro-batches drawn from the grading seed, each
with another resource the slowest, serial and overlapped predictions must equal the lecture's
model applied to that layout, rtol 1e-9 (no synchronous step can measure the overlapped one).
Task 2 (decide from a budget): ``choose_offload(n_params, budget_bytes, activation_bytes)``:
the least offloaded level of ``OFFLOAD_LEVELS`` whose device bytes (bf16-mixed AdamW) plus the
activations fit, or None; six cases drawn from the grading seed (each level once, an exact fit,
activations that alone exceed the budget), exact.
Task 3 (find the bug): ``MyOffloadAdamW``'s ``step``: bit for bit the same parameters as AdamW
on an fp32 model and as the master-weights recipe on a bf16 model after ``STEPS`` steps (the host
runs the same AdamW on the same fp32 numbers: the bits agree, so the tolerance is 0).

Each check is split (:mod:`course_lib.grading.split`): ``collect_*`` calls the learner's code and
hands back what it returned or changed, ``judge_*`` computes what is expected and decides. The
steps of task 1 are measured by ``prepare_step_time`` on the judge's side (``step_breakdown``
runs the course's ``OffloadAdamW``, which the learner's side may not call); the learner's side
hands the measured parts and totals back with the predictions made from them.
"""

from __future__ import annotations

import numbers
from typing import Any

from course_lib.grading.core import fail, passed, run_learner
from course_lib.grading.plain import describe, learner_number
from course_lib.grading.seeds import case_rng
from course_lib.grading.split import need, need_list, split_check
from course_lib.units.u05_cpu_offload.checks_offload_step import (  # noqa: F401 (re-exported)
    STEPS,
    check_offload_step,
)

OFFLOAD_LEVELS = ("none", "optimizer", "optimizer+grads", "all")
STEP_RTOL = 0.1
UNIT = "u05_cpu_offload"
_PARTS = ("compute", "to_host", "store_read", "host_adam", "store_write", "to_device")
_MEASURED_STEPS = 7  # the offloaded steps task 1 measures
_FORBID_1 = [
    "course_lib.measure.estimate.offload:offload_step_time",
    "course_lib.units.u05_cpu_offload.run_bandwidth:predicted_step_times",
]
_FORBID_2 = ["course_lib.measure.estimate.offload:offload_split"]


def _number(task, what, value):
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        fail(task, f"{what}: expected a float (seconds), got {describe(value)}")
    return float(value)


# ---------------------------------------------------------------------------------- task 1
def _resource_loads(parts: dict, k: int) -> tuple[float, float, float, float]:
    """Seconds of work of each resource in a step of ``k`` micro-batches whose gradients cross
    to the host every micro-batch: the device, the link (both directions), the host CPU, the
    disk."""
    link = k * parts["to_host"] + parts["to_device"]
    disk = parts["store_read"] + parts["store_write"]
    return k * parts["compute"], link, parts["host_adam"], disk


def _layout_expected(parts: dict, k: int) -> tuple[float, float]:
    """(serial, overlapped) seconds of that step: the lecture's sum and max over the resources,
    each resource's work added up over the step."""
    loads = _resource_loads(parts, k)
    return sum(loads), max(loads)


def _drawn_steps(task: int) -> list[tuple[dict, int]]:
    """Four steps of 2-32 micro-batches drawn from the grading seed; in step i the i-th resource
    (device, link, host, disk) is the slowest, by 10-50 %."""
    rng = case_rng(task, UNIT)
    out = []
    for slowest in range(4):
        k = rng.randint(2, 32)
        parts = {name: rng.randint(1, 40) / 1000 for name in _PARTS}
        target = max(_resource_loads(parts, k)) * (1 + rng.randint(1, 5) / 10)
        if slowest == 0:
            parts["compute"] = round(target / k, 6)
        elif slowest == 1:
            parts["to_host"] = round((target - parts["to_device"]) / k, 6)
        elif slowest == 2:
            parts["host_adam"] = round(target, 6)
        else:
            parts["store_read"] = round(target - parts["store_write"], 6)
        out.append((parts, k))
    return out


def prepare_step_time(task: int = 1) -> dict[str, Any]:
    """Judge side, before the learner's code runs: offloaded steps measured (state in a file)."""
    import dataclasses

    from course_lib.units.u05_cpu_offload.run import CONFIG, step_breakdown

    df = step_breakdown(
        tier="file",
        steps=_MEASURED_STEPS,
        config=dataclasses.replace(CONFIG, n_layer=1),
        batch=2,
    )
    return {"steps": [{k: float(row[k]) for k in (*_PARTS, "total")} for _, row in df.iterrows()]}


def collect_step_time(predict_step_time, task: int = 1, inputs: Any = None) -> dict[str, Any]:
    """Task 1: the learner's predictions for the measured steps (handed back with their parts
    and totals), then for the drawn steps of several micro-batches."""
    steps = inputs.get("steps") if isinstance(inputs, dict) else None
    if not isinstance(steps, list) or not all(isinstance(s, dict) for s in steps):
        fail(task, "the measured steps did not reach the check: run the check cell again")
    measured = []
    for step in steps:
        parts = {k: step.get(k) for k in _PARTS}
        serial, overlapped = (
            learner_number(
                run_learner(task, predict_step_time, dict(parts), overlap, 1, forbid=_FORBID_1)
            )
            for overlap in (False, True)
        )
        measured.append(
            {"parts": parts, "total": step.get("total"), "serial": serial, "overlapped": overlapped}
        )
    drawn = [
        [
            learner_number(
                run_learner(task, predict_step_time, dict(parts), overlap, k, forbid=_FORBID_1)
            )
            for overlap in (False, True)
        ]
        for parts, k in _drawn_steps(task)
    ]
    return {"measured": measured, "drawn": drawn}


def judge_step_time(data: Any, task: int = 1, inputs: Any = None) -> None:
    """The measured steps come from ``inputs`` (measured on this side before the learner's code
    ran), never from what the run handed back."""
    import statistics

    steps = inputs.get("steps") if isinstance(inputs, dict) else None
    if steps is None:  # the self-check without a prepare (never in the grade)
        steps = prepare_step_time(task)["steps"]
    measured = need(task, data, "measured", list, "measured steps")
    if len(measured) != len(steps):
        fail(task, f"the run handed back {len(measured)} measured steps, not {len(steps)}")
    ratios = []
    for step, answer in zip(steps, measured):
        parts, total = {k: float(step[k]) for k in _PARTS}, float(step["total"])
        if not isinstance(answer, dict):
            fail(task, "the run handed back no predictions for a measured step")
        got = _number(task, "predict_step_time(parts, overlap=False)", answer.get("serial"))
        ratios.append(got / total)
        over = _number(task, "predict_step_time(parts, overlap=True)", answer.get("overlapped"))
        expected = _layout_expected(parts, 1)[1]
        if abs(over - expected) > 1e-9 * expected:
            fail(
                task,
                f"one micro-batch, overlap=True: {over * 1e3:.3f} ms is not the slowest resource's "
                "time (the device, the link both ways, the host CPU, the disk)",
            )
    ratio = statistics.median(ratios)
    if not abs(ratio - 1) <= STEP_RTOL:
        fail(
            task,
            f"overlap=False: your prediction / the measured step = {ratio:.3f} (median of "
            f"{len(ratios)} steps), expected 1 +- {STEP_RTOL:g}: a synchronous step runs "
            "its parts one after the other",
        )
    _judge_drawn_steps(need(task, data, "drawn", list, "predictions for the drawn steps"), task)
    passed(
        task,
        f"serial prediction matches the measured offloaded steps (median ratio within "
        f"1 +- {STEP_RTOL:g}); with gradients sent every micro-batch, serial and overlapped "
        "match on 4 unseen steps",
    )


def _judge_drawn_steps(drawn: list, task: int) -> None:
    steps = _drawn_steps(task)
    if len(drawn) != len(steps) or not all(
        isinstance(pair, (list, tuple)) and len(pair) == 2 for pair in drawn
    ):
        fail(task, "the run handed back no predictions for the drawn steps")
    for (parts, k), pair in zip(steps, drawn):
        for overlap, expected, value in zip((False, True), _layout_expected(parts, k), pair):
            got = _number(
                task, f"predict_step_time(parts, overlap={overlap}, micro_batches={k})", value
            )
            if abs(got - expected) > 1e-9 * expected:
                shown = ", ".join(f"{n} {v * 1e3:g} ms" for n, v in parts.items())
                fail(
                    task,
                    f"{k} micro-batches, overlap={overlap}, parts ({shown}): {got * 1e3:.3f} ms "
                    "is not the lecture's model for this layout (which parts happen once per "
                    "micro-batch, and which resource does each one use?)",
                )


check_step_time = split_check(collect_step_time, judge_step_time, prepare_step_time)


# ---------------------------------------------------------------------------------- task 2
def _offload_cases(task: int) -> list[tuple[int, int, int, str | None]]:
    """(n_params, budget, activations, the least level that fits) drawn from the grading seed:
    each level once, one budget that fits a level exactly, activations alone over budget."""
    GB = 10**9
    device = {"none": 16, "optimizer": 4, "optimizer+grads": 2, "all": 0}  # bytes per param
    rng = case_rng(task, UNIT)
    exact = rng.choice(("optimizer", "optimizer+grads", "all"))
    cases: list[tuple[int, int, int, str | None]] = []
    above = None
    for level in ("none", "optimizer", "optimizer+grads", "all"):
        n, act = rng.randint(5, 400) * GB // 10, rng.randint(1, 30) * GB
        fits = device[level] * n + act
        upper = device[above] * n + act - 1 if above else fits + 100 * GB
        cases.append((n, fits if level == exact else rng.randint(fits, upper), act, level))
        above = level
    n, act = rng.randint(5, 700) * GB // 10, rng.randint(40, 120) * GB
    cases.append((n, act - rng.randint(1, 20) * GB, act, None))  # activations alone do not fit
    n, act = rng.randint(5, 400) * GB // 10, rng.randint(1, 30) * GB
    cases.append((n, 4 * n + act + rng.randint(0, 2 * n), act, "optimizer"))
    rng.shuffle(cases)
    return cases


def collect_choose_offload(choose_offload, task: int = 2) -> list[Any]:
    """Task 2: the learner's choice on each drawn budget (bf16-mixed AdamW)."""
    return [
        run_learner(task, choose_offload, n, budget, act, forbid=_FORBID_2)
        for n, budget, act, _ in _offload_cases(task)
    ]


def judge_choose_offload(data: Any, task: int = 2) -> None:
    """Exact choice on several budgets (device bytes from the unit's table)."""
    GB = 10**9
    cases = _offload_cases(task)
    need_list(task, data, len(cases), "choice", "budgets")
    for (n, budget, act, expected), got in zip(cases, data):
        if got is not None and not isinstance(got, str):
            fail(task, f"expected a level name (str) or None, got {describe(got)}")
        if got != expected:
            fail(
                task,
                f"choose_offload({n / 1e9:g}e9 params, budget {budget / GB:g} GB, activations "
                f"{act / GB:g} GB): {got!r} is not the least offload that fits",
            )
    passed(task, f"the least offload that fits, in all {len(cases)} cases")


check_choose_offload = split_check(collect_choose_offload, judge_choose_offload)
