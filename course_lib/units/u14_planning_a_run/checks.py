"""Unit 14's graded checks (solutions/14_planning_a_run.ipynb, exercises/14_planning_a_run.ipynb).

1. ``check_sized_run``: the learner sizes a Llama-2-70B run on 64 H100s for a budget of days
   and predicts its memory per GPU; graded by the planner: the layout must be valid, fit, meet
   the budget, and the learner's memory must be within 10 % of the planner's;
2. ``check_plan_problems``: the learner's ``problems(model, cluster, layout, batch)`` names what
   is wrong with a plan (TP across nodes, fewer micro-batches than stages, a batch that does not
   divide), graded on plans with none, one or two bugs;
3. ``check_mfu_prediction``: from one plan's step time by part, the learner predicts the MFU
   when the sequence length doubles at the same tokens per batch; graded against the planner's
   step time at the new length, to 1 %.
The planner and the course's answers are out of reach while the learner's code runs.
Each check prints one deterministic line or raises AssertionError("✗ task N: ...").
"""

from __future__ import annotations

import math
import numbers
from typing import TYPE_CHECKING, Any

from course_lib.grading.core import fail, passed, run_learner

if TYPE_CHECKING:
    from course_lib.measure.estimate.activations import Recompute

__all__ = [
    "check_sized_run",
    "check_plan_problems",
    "check_mfu_prediction",
    "PLANNER_REFERENCES",
    "SIZE_CASE",
    "BUDGET_DAYS",
    "MFU_CASES",
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
#: task 1: Llama-2-70B on 64 H100s (8 nodes), 4 Mi tokens per step, 200B tokens
SIZE_CASE: dict[str, Any] = dict(
    model="Llama-2-70B",
    cluster="8xH100 + 400G IB",
    gpus=64,
    global_batch_tokens=4 * 2**20,
    total_tokens=200e9,
)
BUDGET_DAYS = 31.0
_KEYS = {"dp": int, "tp": int, "pp": int, "zero": int, "recompute": str, "micro_batch": int}
#: task 3: (model, gpus, dp, tp, pp, recompute, global batch tokens)
MFU_CASES: tuple[tuple[str, int, int, int, int, Recompute, int], ...] = (
    ("Llama-2-7B", 8, 1, 2, 4, "selective", 2**20),
    ("Llama-2-70B", 64, 2, 8, 4, "full", 2**21),
)


def _layout(task, got):
    from course_lib.plan import Layout

    if not isinstance(got, dict) or set(got) != set(_KEYS):
        fail(task, f"the layout must be a dict with keys {', '.join(_KEYS)}, got {got!r}")
    for k, kind in _KEYS.items():
        if not isinstance(got[k], kind) or isinstance(got[k], bool):
            fail(
                task,
                f"layout[{k!r}] must be {kind.__name__}, got {type(got[k]).__name__} {got[k]!r}",
            )
    try:
        return Layout(**got)
    except ValueError as exc:
        fail(task, str(exc))


def _planned_size_case(task: int, layout) -> tuple[dict, float]:
    """(the planner's row for ``layout`` on SIZE_CASE, usable GB per GPU), or a ✗ verdict."""
    from course_lib import plan as P

    model = P.model(SIZE_CASE["model"])
    cluster = P.cluster(SIZE_CASE["cluster"], gpus=SIZE_CASE["gpus"])
    if layout.gpus != cluster.gpus:
        fail(task, f"dp x tp x pp = {layout.gpus}: use all {cluster.gpus} GPUs")
    try:
        row = P.evaluate(
            model,
            cluster,
            layout,
            global_batch_tokens=SIZE_CASE["global_batch_tokens"],
            total_tokens=SIZE_CASE["total_tokens"],
        )
    except ValueError as exc:
        fail(task, f"the planner refuses this layout: {exc}")
    return row, (1 - P.DEFAULT_RESERVE) * cluster.memory_bytes / 1e9


def check_sized_run(fn, task: int = 1) -> None:
    """Task: ``fn()`` -> ``(layout, memory_bytes)``: a layout dict (dp, tp, pp, zero, recompute,
    micro_batch) for ``SIZE_CASE`` that fits in 76 GB per GPU (80 GB less a 5 % reserve) and
    finishes within ``BUDGET_DAYS`` by the planner, and the learner's own prediction of its
    memory per GPU in bytes, within 10 % of the planner's."""

    got = run_learner(task, fn, forbid=PLANNER_REFERENCES)
    if not isinstance(got, tuple) or len(got) != 2:
        fail(task, f"fn() must return (layout, memory_bytes), got {got!r}")
    layout, memory = _layout(task, got[0]), got[1]
    if (
        isinstance(memory, bool)
        or not isinstance(memory, numbers.Real)
        or not math.isfinite(memory)
    ):
        fail(
            task, f"memory_bytes must be a number of bytes, got {type(memory).__name__} {memory!r}"
        )
    row, usable = _planned_size_case(task, layout)
    if not row["fits"]:
        fail(
            task,
            f"it does not fit: {row['memory_GB']:.1f} GB per GPU > {usable:.1f} GB usable "
            f"(activations {row['activations_GB']:.1f} GB, optimizer {row['optimizer_GB']:.1f} GB)",
        )
    if row["days"] > BUDGET_DAYS:
        fail(
            task,
            f"it fits but takes {row['days']:.1f} days > {BUDGET_DAYS:g} (bubble "
            f"{row['bubble_fraction']:.0%}, TP {row['tp_comm_s']:.1f} s, DP "
            f"{row['dp_comm_s']:.1f} s of a {row['step_s']:.1f} s step)",
        )
    planner_bytes = row["memory_GB"] * 1e9
    if abs(memory - planner_bytes) > 0.10 * planner_bytes:
        fail(
            task,
            f"your memory prediction {memory / 1e9:.1f} GB is more than 10 % from the "
            f"planner's {planner_bytes / 1e9:.1f} GB",
        )
    passed(
        task,
        f"the layout fits in {usable:.0f} GB per GPU, finishes within {BUDGET_DAYS:g} "
        "days, and your memory is within 10 % of the planner's",
    )


def _problem_cases():
    from course_lib.plan import Layout, cluster, model

    m7, m70 = model("Llama-2-7B"), model("Llama-2-70B")
    node, c64 = cluster("8xH100 + 400G IB"), cluster("8xH100 + 400G IB", gpus=64)
    return [  # (model, cluster, layout, global batch tokens, expected problems)
        (m7, node, Layout(8), 1024 * 4096, set()),
        (m70, c64, Layout(4, 8, 2), 1024 * 4096, set()),
        (m70, c64, Layout(4, 16, 1), 1024 * 4096, {"tp_across_nodes"}),
        (m70, c64, Layout(2, 4, 8), 8 * 4096, {"fewer_microbatches_than_stages"}),
        (m70, c64, Layout(8, 8, 1), 1004 * 4096, {"batch_not_divisible"}),
        (m7, node, Layout(2, 1, 4, micro_batch=2), 1000 * 4096 + 2048, {"batch_not_divisible"}),
        (
            m70,
            c64,
            Layout(1, 16, 4),
            2 * 4096,
            {"tp_across_nodes", "fewer_microbatches_than_stages"},
        ),
        (m70, c64, Layout(16, 1, 4), 64 * 4096, set()),
    ]


def check_plan_problems(fn, task: int = 2) -> None:
    """Task: ``fn(model, cluster, layout, global_batch_tokens)`` -> a set of names among
    "tp_across_nodes", "fewer_microbatches_than_stages", "batch_not_divisible" (an empty set for
    a sound plan). Graded on eight plans with none, one or two problems."""
    for i, (model, cluster, layout, tokens, expected) in enumerate(_problem_cases()):
        got = run_learner(task, fn, model, cluster, layout, tokens, forbid=PLANNER_REFERENCES)
        if not isinstance(got, (set, frozenset)):
            fail(task, f"fn must return a set of problem names, got {type(got).__name__} {got!r}")
        if set(got) != expected:
            fail(
                task,
                f"plan {i + 1} ({model.name}, DP {layout.dp} x TP {layout.tp} x PP "
                f"{layout.pp}, micro-batch {layout.micro_batch}, {tokens} tokens per batch, "
                f"{cluster.gpus_per_node} GPUs per node): expected "
                f"{sorted(expected) or 'no problem'}, got {sorted(got) or 'no problem'}",
            )
    passed(
        task,
        "the problems of all 8 plans are named (TP across nodes, fewer micro-batches "
        "than stages, a batch that does not divide)",
    )


def check_mfu_prediction(fn, task: int = 3) -> None:
    """Task: ``fn(parts, model, layout, new_seq)`` -> the MFU (a float) of the same layout when
    the sequence length becomes ``new_seq`` at the same tokens per batch. ``parts`` is the
    planner's step time by part at the old length (``plan.step_time``'s dict). Graded on
    ``MFU_CASES`` (doubling s) against the planner at the new length, to 1 %."""
    from course_lib import plan as P

    for name, gpus, dp, tp, pp, rec, tokens in MFU_CASES:
        model = P.model(name)
        cluster = P.cluster("8xH100 + 400G IB", gpus=gpus)
        layout = P.Layout(dp, tp, pp, 1, rec, 1)
        parts = P.step_time(model, cluster, layout, global_batch_tokens=tokens)
        new = 2 * model.seq_len
        got = run_learner(task, fn, dict(parts), model, layout, new, forbid=PLANNER_REFERENCES)
        if isinstance(got, bool) or not isinstance(got, numbers.Real) or not math.isfinite(got):
            fail(task, f"fn must return the MFU as a float, got {type(got).__name__} {got!r}")
        got = float(got)
        expected = P.step_time(
            model.replace(seq_len=new), cluster, layout, global_batch_tokens=tokens
        )["mfu"]
        if abs(got - expected) > 0.01 * expected:
            fail(
                task,
                f"{name}, DP {dp} x TP {tp} x PP {pp}, {rec} recomputation, s {model.seq_len}"
                f" -> {new}: MFU {parts['mfu']:.4f} -> planner {expected:.4f}, you "
                f"predicted {float(got):.4f}",
            )
    passed(
        task,
        "the MFU at twice the sequence length matches the planner to 1 % for "
        f"{len(MFU_CASES)} layouts",
    )
