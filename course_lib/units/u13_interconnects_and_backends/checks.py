"""Checks for the exercises of unit 13 (solutions/13_interconnects_and_backends.ipynb).

Five tasks; the verdict line is the same on every machine:

1. fit alpha and beta to a *recorded* sweep (``data/sweep.json``, shipped with the course:
   a real gloo sweep, with where and how it was recorded stored in the file), minimising the
   relative error as the lecture does (``estimate.fit_alpha_beta(..., relative=True)``);
2. choose a DDP bucket size for a given alpha, beta and backward time, against the reference rule
   :func:`reference_bucket_bytes` documented below;
3. find the bug: a planning function that divides by NVLink's bidirectional headline; the fixed
   one is graded against ``estimate.allreduce_time_on_link`` at the per-direction figure
   (:mod:`.checks_links`);
4. scale it up: 7B and 70B gradient all-reduces in one NVLink node and across 4 nodes on
   InfiniBand, against ``estimate.allreduce_time_on_link`` and
   ``estimate.hierarchical_allreduce_time`` (:mod:`.checks_links`);
5. predict before you measure: the time of a gloo all-reduce at a size the learner is not shown,
   from the other sizes measured in the same run, graded against a measurement of that size
   (within a factor of 3: a shared 2-core machine; three runs, three predictions, one of them
   within the factor passes).

Each check is split (:mod:`course_lib.grading.split`): ``collect_X`` calls the learner's function
on the drawn cases and hands back what it returned, ``judge_X`` draws the same cases, computes the
answer with the course's reference and prints one deterministic line or raises AssertionError.
"""

from __future__ import annotations

import json
import math
from functools import lru_cache
from importlib import resources
from typing import Any, Sequence

from course_lib.grading.core import expect_int, fail, passed, run_learner
from course_lib.grading.plain import learner_value
from course_lib.grading.split import need, need_list, split_check
from course_lib.units.u13_interconnects_and_backends.checks_links import (
    SCALE_GPUS,
    SCALE_NODES,
    buggy_predict_allreduce_s,
    check_allreduce_prediction,
    check_scale_up,
)

__all__ = [
    "load_sweep",
    "sweep_provenance",
    "reference_bucket_bytes",
    "check_alpha_beta_fit",
    "check_bucket_choice",
    "check_allreduce_prediction",
    "check_scale_up",
    "check_predict_heldout",
    "buggy_predict_allreduce_s",
    "SCALE_GPUS",
    "SCALE_NODES",
]

MiB = 2**20


# --------------------------------------------------------------------------------------------
# the recorded sweep
# --------------------------------------------------------------------------------------------
@lru_cache(maxsize=1)
def _sweep_document() -> dict:
    with resources.files(__package__).joinpath("data/sweep.json").open() as f:
        return json.load(f)


def load_sweep():
    """The recorded gloo sweep as a tidy DataFrame (same columns as
    ``run.collective_sweep``; see :func:`sweep_provenance`)."""
    import pandas as pd

    doc = _sweep_document()
    return pd.DataFrame(doc["records"], columns=doc["columns"])


def sweep_provenance() -> dict:
    """Where, when and how the recorded sweep was measured (machine, torch version, date...)."""
    return dict(_sweep_document()["provenance"])


# --------------------------------------------------------------------------------------------
# the reference rule for task 2
# --------------------------------------------------------------------------------------------
def reference_bucket_bytes(
    alpha: float, beta: float, backward_s: float, grad_bytes: int, candidates: Sequence[int]
) -> int:
    """The candidate bucket size with the least exposed communication
    (``estimate.ddp_exposed_comm_time``); on a tie (within a relative 1e-9) the larger bucket,
    which makes fewer calls."""
    if not candidates:
        raise ValueError("candidates must not be empty")
    from course_lib.measure import estimate

    best, best_t = None, math.inf
    for b in sorted(int(c) for c in candidates):
        t = estimate.ddp_exposed_comm_time(
            b, grad_bytes=grad_bytes, backward_s=backward_s, alpha=alpha, beta=beta
        )
        if best is None or t < best_t or math.isclose(t, best_t, rel_tol=1e-9, abs_tol=1e-15):
            best, best_t = b, min(t, best_t)
    assert best is not None  # candidates is not empty
    return best


# --------------------------------------------------------------------------------------------
# checks
# --------------------------------------------------------------------------------------------
#: the course's own answers, out of reach while the learner's function runs
_FIT_REFERENCES = ("course_lib.measure.estimate.links:fit_alpha_beta",)
_BUCKET_REFERENCES = (
    "course_lib.measure.estimate.links:ddp_exposed_comm_time",
    "course_lib.units.u13_interconnects_and_backends.checks:reference_bucket_bytes",
)


def _groups():
    df = load_sweep()
    for (coll, ws), g in df.groupby(["collective", "world_size"], sort=True):
        yield coll, int(ws), g["size_bytes"].tolist(), g["time_s"].tolist()


def _fit_cases(task: int):
    """(collective, world size, sizes, times) of every recorded sweep, one point of each, drawn
    from the grading seed, left out."""
    from course_lib.grading.seeds import case_rng

    rng = case_rng(task, "u13_interconnects_and_backends")
    for coll, ws, all_sizes, all_times in _groups():
        drop = rng.randrange(len(all_sizes))
        sizes = [x for i, x in enumerate(all_sizes) if i != drop]
        times = [x for i, x in enumerate(all_times) if i != drop]
        yield coll, ws, sizes, times


def collect_alpha_beta_fit(fit_alpha_beta, task: int = 1) -> list[dict[str, Any]]:
    """Task: the relative-error fit of T = alpha + beta S (each point weighted by 1/T^2, the
    fit the lecture uses) on every (collective, world size) of the recorded sweep, one point of
    each drawn from the grading seed left out (so a fit printed in the lecture does not match),
    compared with estimate.fit_alpha_beta(sizes, times, relative=True) (rtol 1e-6; alpha also
    within 1e-9 s)."""
    out: list[dict[str, Any]] = []
    for _coll, _ws, sizes, times in _fit_cases(task):
        got = run_learner(task, fit_alpha_beta, list(sizes), list(times), forbid=_FIT_REFERENCES)
        try:
            alpha, beta = (float(v) for v in got)
        except (TypeError, ValueError):
            out.append({"got": learner_value(got)})  # not a pair: the judge says what it is
        else:
            out.append({"fit": (alpha, beta)})
    return out


def judge_alpha_beta_fit(data: Any, task: int = 1) -> None:
    from course_lib.measure import estimate

    cases = list(_fit_cases(task))
    n = 0
    for (coll, ws, sizes, times), answer in zip(cases, need_list(task, data, len(cases), "fit")):
        fit = answer.get("fit") if isinstance(answer, dict) else None
        if not (isinstance(fit, tuple) and len(fit) == 2 and all(type(v) is float for v in fit)):
            got = answer.get("got") if isinstance(answer, dict) else answer
            fail(
                task, f"{coll}, {ws} ranks: expected a pair (alpha_s, beta_s_per_byte), got {got!r}"
            )
        alpha, beta = fit
        expected = estimate.fit_alpha_beta(sizes, times, relative=True)
        plain = estimate.fit_alpha_beta(sizes, times)
        for name, g, e, p, atol in (
            ("alpha", alpha, expected[0], plain[0], 1e-9),
            ("beta", beta, expected[1], plain[1], 0.0),
        ):
            if not math.isclose(g, e, rel_tol=1e-6, abs_tol=atol):
                hint = (
                    " -- that is the plain least-squares fit, which the largest messages "
                    "dominate: weight each point by 1/T^2"
                    if math.isclose(g, p, rel_tol=1e-6, abs_tol=atol)
                    else " (relative-error fit of time_s on size_bytes, both in base units)"
                )
                fail(
                    task,
                    f"{coll}, {ws} ranks, {len(sizes)} sizes: your {name} = {g:.6g} is "
                    f"{'above' if g > e else 'below'} the relative-error fit's{hint}",
                )
        n += 1
    passed(task, f"alpha and beta match the relative-error fit on all {n} recorded sweeps")


check_alpha_beta_fit = split_check(collect_alpha_beta_fit, judge_alpha_beta_fit)


def prepare_bucket_choice(task: int = 2) -> list[tuple]:
    """Task 2's scenarios (judge side: drawing them weighs the candidates with
    ``estimate.ddp_exposed_comm_time``, which the learner may not call)."""
    from course_lib.units.u13_interconnects_and_backends._cases import bucket_scenarios

    return bucket_scenarios(task)


def collect_bucket_choice(choose_bucket_bytes, task: int = 2, inputs: Any = None) -> list[Any]:
    """Task: pick the bucket size with the least exposed communication (reference rule:
    :func:`reference_bucket_bytes`) in five scenarios drawn from the grading seed (latency-bound
    to bandwidth-bound, one whose backward hides everything)."""
    return [
        learner_value(
            run_learner(task, choose_bucket_bytes, *case, list(cands), forbid=_BUCKET_REFERENCES)
        )
        for _name, *case, cands in inputs
    ]


def judge_bucket_choice(data: Any, task: int = 2) -> None:
    from course_lib.measure import estimate
    from course_lib.units.u13_interconnects_and_backends._cases import bucket_scenarios

    scenarios = bucket_scenarios(task)
    for (name, alpha, beta, bwd, grad, cands), got in zip(
        scenarios, need_list(task, data, len(scenarios), "bucket size")
    ):
        expected = reference_bucket_bytes(alpha, beta, bwd, grad, cands)
        expect_int(task, f"the bucket size (bytes) in scenario '{name}'", got)
        if got != expected:
            case = (
                f"scenario '{name}' (alpha {alpha * 1e6:.4g} us, {1 / beta / 1e9:.4g} GB/s, "
                f"backward {bwd * 1e3:.4g} ms, {grad // MiB} MiB of gradients)"
            )
            detail = ""
            if got in cands:
                t_got = estimate.ddp_exposed_comm_time(
                    got, grad_bytes=grad, backward_s=bwd, alpha=alpha, beta=beta
                )
                detail = f": it exposes {t_got * 1e3:.4g} ms, and another candidate exposes less"
                detail += " or as little with fewer calls"
            fail(task, f"{case}: you chose {got!r} B{detail or ', not one of the candidates'}")
    passed(task, f"bucket sizes match the reference rule in {len(scenarios)} drawn scenarios")


check_bucket_choice = split_check(collect_bucket_choice, judge_bucket_choice, prepare_bucket_choice)


# --------------------------------------------------------------------------------------------
# task 5: predict before you measure
# --------------------------------------------------------------------------------------------
#: sizes measured (2 gloo ranks, all-reduce): the learner is shown all but HELD_OUT, which only
#: the judge measures
PREDICT_SIZES = tuple(16 * 1024 * 4**k for k in range(6))  # 16 KiB .. 16 MiB
HELD_OUT = 4 * MiB
SHOWN_SIZES = tuple(s for s in PREDICT_SIZES if s != HELD_OUT)
PREDICT_FACTOR = 3.0  # a shared 2-core machine: a few x of noise at one size is common
PREDICT_RUNS = 3  # a machine shared with other work can spoil one run
_PREDICT_REFERENCES = _FIT_REFERENCES + (
    "course_lib.units.u13_interconnects_and_backends.run_sweep:fit_sweep",
    "course_lib.units.u13_interconnects_and_backends.run_sweep:sweep_residuals",
)


def _measure_all_reduce(sizes) -> dict[int, float]:
    """Seconds of an all-reduce of each of ``sizes`` bytes on 2 gloo ranks (float32; the
    fastest of 7 calls after 2 untimed ones: other work on a shared machine only ever adds
    time), one launch of the sweep's worker (``run.collective_sweep``)."""
    from course_lib.runtime.launch import launch
    from course_lib.units.u13_interconnects_and_backends.run_sweep import _sweep_worker

    records = launch(
        _sweep_worker, 2, "all_reduce", list(sizes), 2, 7, "float32", backend="gloo", timeout=120.0
    )[0]
    return {int(r.size_bytes): float(r.time_min_s) for r in records}


def collect_predict_heldout(predict_time_s, task: int = 5) -> dict[str, list[Any]]:
    """Task: ``predict_time_s(sizes, times, size)`` predicts the seconds of an all-reduce of
    ``size`` bytes on 2 gloo ranks from the (sizes, times) measured in the same run (the fastest
    of 7 calls each). The check measures 16 KiB .. 16 MiB now, all but 4 MiB, asks, then measures
    4 MiB: within a factor of 3 either way passes. A machine shared with other work can spoil
    one run, so there are 3 runs, a new prediction from each run's own data, each compared with
    a new measurement; one within the factor passes, a wrong prediction misses them all."""
    if not callable(predict_time_s):
        fail(task, f"expected a function, got {type(predict_time_s).__name__} {predict_time_s!r}")
    predictions = []
    for _ in range(PREDICT_RUNS):
        measured = _measure_all_reduce(SHOWN_SIZES)
        shown = [s for s in sorted(measured) if s != HELD_OUT]
        got = run_learner(
            task,
            predict_time_s,
            list(shown),
            [measured[s] for s in shown],
            HELD_OUT,
            forbid=_PREDICT_REFERENCES,
        )
        predictions.append(learner_value(got))
    return {"predictions": predictions}


def judge_predict_heldout(data: Any, task: int = 5) -> None:
    predictions = need(task, data, "predictions", list)
    if len(predictions) != PREDICT_RUNS:
        fail(task, f"the run handed back {len(predictions)} predictions, not {PREDICT_RUNS}")
    misses = []
    for got in predictions:
        if isinstance(got, bool) or not isinstance(got, (int, float)) or not got > 0:
            fail(task, f"expected a positive number of seconds, got {got!r}")
        truth = _measure_all_reduce((HELD_OUT,))[HELD_OUT]
        if 1 / PREDICT_FACTOR <= truth / float(got) <= PREDICT_FACTOR:
            passed(
                task,
                f"the prediction for {HELD_OUT // MiB} MiB is within a factor of "
                f"{PREDICT_FACTOR:g} of the all-reduce measured now on 2 gloo ranks",
            )
            return
        misses.append(f"predicted {float(got) * 1e3:.3g} ms, measured {truth * 1e3:.3g} ms")
    fail(
        task,
        f"for {HELD_OUT // MiB} MiB, in 3 runs: {'; '.join(misses)} (within a factor of "
        f"{PREDICT_FACTOR:g} passes)",
    )


check_predict_heldout = split_check(collect_predict_heldout, judge_predict_heldout)
