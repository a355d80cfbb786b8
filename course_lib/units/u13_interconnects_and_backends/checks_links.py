"""Unit 13's checks of tasks 3 and 4 (link arithmetic), re-exported by :mod:`.checks`.

3. find the bug: a planning function that divides by NVLink's bidirectional headline; the fixed
   one is graded against ``estimate.allreduce_time_on_link`` at the per-direction figure;
4. scale it up: 7B and 70B gradient all-reduces in one NVLink node and across 4 nodes on
   InfiniBand, against ``estimate.allreduce_time_on_link`` and
   ``estimate.hierarchical_allreduce_time``.

Each check is split (:mod:`course_lib.grading.split`): ``collect_X`` calls the learner's function
on the drawn cases and hands back what it returned; ``judge_X`` draws the same cases, computes
what ``estimate`` says and gives the verdict (a learner's value crosses as
:func:`course_lib.grading.plain.learner_value` reads it).
"""

from __future__ import annotations

import math
from typing import Any

from course_lib.grading.core import fail, passed, run_learner
from course_lib.grading.plain import learner_value
from course_lib.grading.split import need_list, split_check

__all__ = [
    "SCALE_GPUS",
    "SCALE_NODES",
    "buggy_predict_allreduce_s",
    "check_allreduce_prediction",
    "check_scale_up",
]


# --------------------------------------------------------------------------------------------
# task 3: find the bug
# --------------------------------------------------------------------------------------------
#: the course's own answers, out of reach while the learner's function runs
_LINK_REFERENCES = (
    "course_lib.measure.estimate.links:allreduce_time_on_link",
    "course_lib.measure.estimate.links:allreduce_time",
    "course_lib.measure.estimate.links:alpha_beta_time",
)


def buggy_predict_allreduce_s(n_params, dtype, world_size, link):
    """The planning function of task 3, with its one mistake (shown to the learner)."""
    from course_lib.measure import estimate

    size = n_params * estimate.dtype_bytes(dtype)
    bandwidth = estimate.link_speed(link).headline_GBps * 1e9
    return 2 * (world_size - 1) / world_size * size / bandwidth


def _time_on_link(n_params, dtype, ws, link) -> float:
    from course_lib.measure import estimate

    size = n_params * estimate.dtype_bytes(dtype)
    return estimate.allreduce_time_on_link(size, ws, estimate.link_speed(link).per_direction_GBps)


def collect_allreduce_prediction(predict_allreduce_s, task: int = 3) -> list[Any]:
    """Task (find the bug): ring all-reduce time of a model's gradients on a published link, at
    the link's per-direction bandwidth, compared with estimate.allreduce_time_on_link (rtol 1e-6)
    on five drawn models and links; the NVLink cases fail an answer that keeps the bidirectional
    headline."""
    from course_lib.units.u13_interconnects_and_backends._cases import link_cases

    return [
        learner_value(
            run_learner(
                task, predict_allreduce_s, n_params, dtype, ws, link, forbid=_LINK_REFERENCES
            )
        )
        for n_params, dtype, ws, link in link_cases(task)
    ]


def judge_allreduce_prediction(data: Any, task: int = 3) -> None:
    from course_lib.units.u13_interconnects_and_backends._cases import link_cases

    cases = link_cases(task)
    for (n_params, dtype, ws, link), got in zip(cases, need_list(task, data, len(cases), "time")):
        expected = _time_on_link(n_params, dtype, ws, link)
        if isinstance(got, bool) or not isinstance(got, (int, float)):
            fail(
                task,
                f"{n_params:.0e} params ({dtype}), {ws} ranks, {link}: expected seconds "
                f"(a float), got {got!r}",
            )
        if not math.isclose(float(got), expected, rel_tol=1e-6):
            headline = buggy_predict_allreduce_s(n_params, dtype, ws, link)
            hint = (
                " -- still the bidirectional headline: a ring step sends one way while it "
                "receives the other"
                if math.isclose(float(got), headline, rel_tol=1e-6)
                else ""
            )
            fail(
                task,
                f"{n_params / 1e9:g}B params ({dtype}), {ws} ranks, {link}: you predicted "
                f"{float(got) * 1e3:.4g} ms, {'less' if got < expected else 'more'} than the "
                f"ring takes{hint}",
            )
    passed(
        task,
        f"all-reduce times match estimate on {len(cases)} drawn links and models, NVLink at "
        "its per-direction bandwidth",
    )


check_allreduce_prediction = split_check(collect_allreduce_prediction, judge_allreduce_prediction)


# --------------------------------------------------------------------------------------------
# task 4: scale it up
# --------------------------------------------------------------------------------------------
#: the cluster of task 4: 4 nodes of 8 H100 (NVLink, NVSwitch), one 400 Gb/s InfiniBand NDR NIC
#: per GPU; bf16 gradients; no latency term (bandwidth-bound at this size)
SCALE_NODES, SCALE_GPUS = 4, 8
_SCALE_REFERENCES = _LINK_REFERENCES + (
    "course_lib.measure.estimate.links:hierarchical_allreduce_time",
    "course_lib.measure.estimate.links:hierarchical_allreduce_breakdown",
)


def _scale_expected(n_params: int) -> dict:
    from course_lib.measure import estimate

    size = n_params * estimate.dtype_bytes("bf16")
    nv, ib = estimate.link_speed("NVLink H100"), estimate.link_speed("InfiniBand NDR")
    return {
        "node": estimate.allreduce_time_on_link(size, SCALE_GPUS, nv.per_direction_GBps),
        "cluster": estimate.hierarchical_allreduce_time(
            size,
            nodes=SCALE_NODES,
            gpus_per_node=SCALE_GPUS,
            intra_GBps=nv.per_direction_GBps,
            inter_GBps=ib.per_direction_GBps,
        ),
    }


def collect_scale_up(allreduce_7b_70b, task: int = 4) -> list[Any]:
    """Task: ``allreduce_7b_70b(n_params)`` returns ``{"node": s, "cluster": s}``: the bf16
    gradient all-reduce of one step as a ring over the 8 H100s of one node (NVLink, per
    direction), and hierarchically over 4 such nodes (reduce-scatter in the node, ring all-reduce
    of each 1/8 shard across nodes on its GPU's own 400 Gb/s NIC, all-gather in the node), no
    latency. Graded for two drawn model sizes (2B-20B and 30B-200B) against estimate (rtol
    1e-6)."""
    from course_lib.units.u13_interconnects_and_backends._cases import scale_models

    return [
        learner_value(run_learner(task, allreduce_7b_70b, n_params, forbid=_SCALE_REFERENCES))
        for n_params in scale_models(task)
    ]


def judge_scale_up(data: Any, task: int = 4) -> None:
    from course_lib.units.u13_interconnects_and_backends._cases import scale_models

    models = scale_models(task)
    for n_params, got in zip(models, need_list(task, data, len(models), "answer")):
        expected = _scale_expected(n_params)
        if not isinstance(got, dict) or set(got) != {"node", "cluster"}:
            fail(
                task,
                f"{n_params / 1e9:g}B params: expected a dict with keys 'node' and 'cluster' "
                f"(seconds), got {got!r}",
            )
        for key, e in expected.items():
            g = got[key]
            if (
                isinstance(g, bool)
                or not isinstance(g, (int, float))
                or not math.isclose(g, e, rel_tol=1e-6)
            ):
                seen = f"{g * 1e3:.4g} ms" if isinstance(g, (int, float)) else repr(g)
                fail(
                    task,
                    f"{n_params / 1e9:g}B params, {key}: you predicted {seen}, not what the "
                    f"{'ring in one node' if key == 'node' else 'hierarchical all-reduce'} takes",
                )
    passed(
        task,
        f"one node and {SCALE_NODES} nodes: all-reduce times match estimate for two drawn "
        "model sizes",
    )


check_scale_up = split_check(collect_scale_up, judge_scale_up)
