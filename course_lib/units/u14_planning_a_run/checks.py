"""Unit 14's graded checks (solutions/14_planning_a_run.ipynb, exercises/14_planning_a_run.ipynb).

1. ``check_sized_run``: the learner sizes a Llama-2-70B run on a drawn number of H100s for a
   drawn number of tokens and budget of days, and predicts its memory per GPU; graded by the
   planner: the layout must be valid, fit, meet the budget, and the learner's memory must be
   within 10 % of the planner's;
2. ``check_plan_problems``: the learner's ``problems(model, cluster, layout, batch)`` names what
   is wrong with a plan (TP across nodes, fewer micro-batches than stages, a batch that does not
   divide), graded on eight drawn plans with none, one or two bugs;
3. ``check_mfu_prediction``: from one plan's step time by part, the learner predicts the MFU
   when the sequence length grows (2 or 4 x) at the same tokens per batch; graded against the
   planner's step time at the new length, to 1 %, on two drawn layouts.
The cases come from the grading seed (``_cases``). The planner and the course's answers are
out of reach while the learner's code runs.
Each check is split (:mod:`course_lib.grading.split`): ``collect_X`` calls the learner's function
and hands back what it returned; ``judge_X`` draws the same case, asks the planner and prints one
deterministic line or raises AssertionError("✗ task N: ..."). What the learner's function is given
and only the planner computes (task 1's budget, task 3's step time by part) comes from
``prepare_X``, on the judge's side: in the grade's sandbox the planner is absent.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

from course_lib.grading.core import fail, passed, run_learner
from course_lib.grading.plain import learner_value, type_name
from course_lib.grading.split import need_list, split_check

__all__ = [
    "check_sized_run",
    "check_plan_problems",
    "check_mfu_prediction",
    "PLANNER_REFERENCES",
]

PLANNER_REFERENCES = (
    "course_lib.plan.planner:plan",
    "course_lib.plan.planner:evaluate",
    "course_lib.plan.planner:step_time",
    "course_lib.plan.memory:predict_memory",
    "course_lib.plan.memory:check_layout",
    "course_lib.plan.memory:microbatches",
    "course_lib.units.u14_planning_a_run.run:plan_run",
    "course_lib.units.u14_planning_a_run.run:plan_problems",
)
_KEYS = {"dp": int, "tp": int, "pp": int, "zero": int, "recompute": str, "micro_batch": int}


def _layout(task, got):
    from course_lib.plan import Layout

    if not isinstance(got, dict) or set(got) != set(_KEYS):
        fail(task, f"the layout must be a dict with keys {', '.join(_KEYS)}, got {got!r}")
    for k, kind in _KEYS.items():
        if not isinstance(got[k], kind) or isinstance(got[k], bool):
            fail(
                task,
                f"layout[{k!r}] must be {kind.__name__}, "
                f"got {type_name(got[k], short=True)} {got[k]!r}",
            )
    try:
        return Layout(**got)
    except ValueError as exc:
        fail(task, str(exc))


def _planned_size_case(task: int, case: dict, layout) -> tuple[dict, float]:
    """(the planner's row for ``layout`` on the drawn case, usable GB per GPU), or a ✗ verdict."""
    from course_lib import plan as P

    model = P.model(case["model"])
    cluster = P.cluster(case["cluster"], gpus=case["gpus"])
    if layout.gpus != cluster.gpus:
        fail(task, f"dp x tp x pp = {layout.gpus}: use all {cluster.gpus} GPUs")
    try:
        row = P.evaluate(
            model,
            cluster,
            layout,
            global_batch_tokens=case["global_batch_tokens"],
            total_tokens=case["total_tokens"],
        )
    except ValueError as exc:
        fail(task, f"the planner refuses this layout: {exc}")
    return row, (1 - P.DEFAULT_RESERVE) * cluster.memory_bytes / 1e9


# ---- task 1 --------------------------------------------------------------------------------
def prepare_sized_run(task: int = 1) -> dict[str, Any]:
    """Task 1's case (judge side: its budget is the planner's fastest plan, and the planner is
    absent from the grade's sandbox)."""
    from course_lib.units.u14_planning_a_run._cases import size_case

    return size_case(task)


def collect_sized_run(fn, task: int = 1, inputs: Any = None) -> dict[str, Any]:
    """Task: ``fn(gpus, total_tokens, budget_days)`` -> ``(layout, memory_bytes)``: a layout
    dict (dp, tp, pp, zero, recompute, micro_batch) for Llama-2-70B on ``gpus`` H100s (nodes of
    8), 4 Mi tokens per step, that fits in 76 GB per GPU (80 GB less a 5 % reserve) and
    finishes ``total_tokens`` within ``budget_days`` by the planner, and the learner's own
    prediction of its memory per GPU in bytes, within 10 % of the planner's. The GPUs, tokens
    and budget (1.4 x the planner's fastest plan, rounded up) are drawn."""
    case = inputs
    args = (case["gpus"], case["total_tokens"], case["budget_days"])
    return {"answer": learner_value(run_learner(task, fn, *args, forbid=PLANNER_REFERENCES))}


def judge_sized_run(data: Any, task: int = 1) -> None:
    from course_lib.units.u14_planning_a_run._cases import size_case

    if not isinstance(data, dict) or "answer" not in data:
        fail(task, "the run handed back no answer")
    case, got = size_case(task), data["answer"]
    where = f"{case['gpus']} GPUs, {case['total_tokens'] / 1e9:g}B tokens, {case['budget_days']:g} days: "
    if not isinstance(got, tuple) or len(got) != 2:
        fail(task, f"{where}fn(...) must return (layout, memory_bytes), got {got!r}")
    layout, memory = _layout(task, got[0]), got[1]
    if (
        isinstance(memory, bool)
        or not isinstance(memory, numbers.Real)
        or not math.isfinite(memory)
    ):
        fail(
            task,
            "memory_bytes must be a number of bytes, "
            f"got {type_name(memory, short=True)} {memory!r}",
        )
    row, usable = _planned_size_case(task, case, layout)
    budget = case["budget_days"]
    if not row["fits"]:
        fail(
            task,
            f"{where}it does not fit: {row['memory_GB']:.1f} GB per GPU > {usable:.1f} GB usable "
            f"(activations {row['activations_GB']:.1f} GB, optimizer {row['optimizer_GB']:.1f} GB)",
        )
    if row["days"] > budget:
        fail(
            task,
            f"{where}it fits but takes {row['days']:.1f} days > {budget:g} (bubble "
            f"{row['bubble_fraction']:.0%}, TP {row['tp_comm_s']:.1f} s, DP "
            f"{row['dp_comm_s']:.1f} s of a {row['step_s']:.1f} s step)",
        )
    planner_bytes = row["memory_GB"] * 1e9
    if abs(memory - planner_bytes) > 0.10 * planner_bytes:
        fail(
            task,
            f"{where}your memory prediction {memory / 1e9:.1f} GB is more than 10 % "
            f"{'below' if memory < planner_bytes else 'above'} the planner's for that layout",
        )
    passed(
        task,
        f"the layout fits in {usable:.0f} GB per GPU, finishes within the budget, and your "
        "memory is within 10 % of the planner's",
    )


check_sized_run = split_check(collect_sized_run, judge_sized_run, prepare_sized_run)


# ---- task 2 --------------------------------------------------------------------------------
def _problem_plans(task: int):
    """(model, cluster, layout, global batch tokens) of each of task 2's drawn plans."""
    from course_lib import plan as P
    from course_lib.units.u14_planning_a_run._cases import CLUSTER, problem_cases

    for name, gpus, (dp, tp, pp, mb), tokens in problem_cases(task):
        yield (
            P.model(name),
            P.cluster(CLUSTER, gpus=gpus),
            P.Layout(dp, tp, pp, micro_batch=mb),
            tokens,
        )


def collect_plan_problems(fn, task: int = 2) -> list[dict[str, Any]]:
    """Task: ``fn(model, cluster, layout, global_batch_tokens)`` -> a set of names among
    "tp_across_nodes", "fewer_microbatches_than_stages", "batch_not_divisible" (an empty set for
    a sound plan). Graded on eight drawn plans with none, one or two problems."""
    out: list[dict[str, Any]] = []
    for model, cluster, layout, tokens in _problem_plans(task):
        got = run_learner(task, fn, model, cluster, layout, tokens, forbid=PLANNER_REFERENCES)
        if isinstance(got, (set, frozenset)):  # plain data has no sets: its items, as a list
            out.append({"set": [learner_value(name) for name in got]})
        else:
            out.append({"other": learner_value(got)})
    return out


def judge_plan_problems(data: Any, task: int = 2) -> None:
    from course_lib.units.u14_planning_a_run.run import plan_problems

    plans = list(_problem_plans(task))
    need_list(task, data, len(plans), "answer", "plans")
    for i, ((model, cluster, layout, tokens), answer) in enumerate(zip(plans, data)):
        items = answer.get("set") if isinstance(answer, dict) else None
        try:
            got = set(items) if isinstance(items, list) else None
        except TypeError:  # an unhashable item: not a set of names
            got = None
        if got is None:
            other = answer.get("other") if isinstance(answer, dict) else answer
            fail(
                task,
                "fn must return a set of problem names, "
                f"got {type_name(other, short=True)} {other!r}",
            )
        expected = plan_problems(model, cluster, layout, tokens)
        if got != expected:
            fail(
                task,
                f"plan {i + 1} ({model.name}, DP {layout.dp} x TP {layout.tp} x PP "
                f"{layout.pp}, micro-batch {layout.micro_batch}, {tokens} tokens per batch, "
                f"{cluster.gpus_per_node} GPUs per node): you found "
                f"{sorted(got, key=str) or 'no problem'}; {len(expected)} problem(s) in this plan",
            )
    passed(
        task,
        "the problems of all 8 drawn plans are named (TP across nodes, fewer micro-batches "
        "than stages, a batch that does not divide)",
    )


check_plan_problems = split_check(collect_plan_problems, judge_plan_problems)


# ---- task 3 --------------------------------------------------------------------------------
def _mfu_case(c: dict[str, Any]) -> tuple:
    """(model, cluster, layout, new sequence length) of one of task 3's drawn cases."""
    from course_lib import plan as P
    from course_lib.units.u14_planning_a_run._cases import CLUSTER

    model = P.model(c["model"])
    dp, tp, pp = c["layout"]
    layout = P.Layout(dp, tp, pp, 1, c["recompute"], 1)
    return model, P.cluster(CLUSTER, gpus=c["gpus"]), layout, c["factor"] * model.seq


def prepare_mfu_prediction(task: int = 3) -> list[dict[str, Any]]:
    """The planner's step time by part of each of task 3's layouts at the old length: what the
    learner's function is given (judge side: the planner is absent from the grade's sandbox)."""
    from course_lib import plan as P
    from course_lib.units.u14_planning_a_run._cases import mfu_cases

    out = []
    for c in mfu_cases(task):
        model, cluster, layout, _new = _mfu_case(c)
        out.append(dict(P.step_time(model, cluster, layout, global_batch_tokens=c["tokens"])))
    return out


def collect_mfu_prediction(fn, task: int = 3, inputs: Any = None) -> list[Any]:
    """Task: ``fn(parts, model, layout, new_seq)`` -> the MFU (a float) of the same layout when
    the sequence length becomes ``new_seq`` at the same tokens per batch. ``parts`` is the
    planner's step time by part at the old length (``plan.step_time``'s dict). Graded on two
    drawn layouts (2 or 4 x the sequence) against the planner at the new length, to 1 %."""
    from course_lib.units.u14_planning_a_run._cases import mfu_cases

    out = []
    for c, parts in zip(mfu_cases(task), inputs):
        model, _cluster, layout, new = _mfu_case(c)
        got = run_learner(task, fn, dict(parts), model, layout, new, forbid=PLANNER_REFERENCES)
        out.append(learner_value(got))
    return out


def judge_mfu_prediction(data: Any, task: int = 3) -> None:
    from course_lib import plan as P
    from course_lib.units.u14_planning_a_run._cases import mfu_cases

    cases = mfu_cases(task)
    need_list(task, data, len(cases), "MFU", "layouts")
    for c, got in zip(cases, data):
        model, cluster, layout, new = _mfu_case(c)
        tokens = c["tokens"]
        parts = P.step_time(model, cluster, layout, global_batch_tokens=tokens)
        if isinstance(got, bool) or not isinstance(got, numbers.Real) or not math.isfinite(got):
            fail(
                task, f"fn must return the MFU as a float, got {type_name(got, short=True)} {got!r}"
            )
        got = float(got)
        longer = model.replace(seq=new)
        expected = P.step_time(longer, cluster, layout, global_batch_tokens=tokens)["mfu"]
        if abs(got - expected) > 0.01 * expected:
            dp, tp, pp = c["layout"]
            fail(
                task,
                f"{c['model']}, DP {dp} x TP {tp} x PP {pp}, {c['recompute']} recomputation, "
                f"{tokens} tokens per batch, s {model.seq} -> {new}: MFU {parts['mfu']:.4f} "
                f"-> you predicted {got:.4f}, more than 1 % "
                f"{'below' if got < expected else 'above'} the planner",
            )
    passed(
        task,
        f"the MFU at a longer sequence matches the planner to 1 % for {len(cases)} drawn layouts",
    )


check_mfu_prediction = split_check(
    collect_mfu_prediction, judge_mfu_prediction, prepare_mfu_prediction
)
