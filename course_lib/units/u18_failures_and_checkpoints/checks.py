"""Checks for the exercises of unit 18 (solutions/18_failures_and_checkpoints.ipynb).

Task 1: ``MyTrainState(model, optimizer, scheduler, data)`` with ``state_dict()`` /
``load_state_dict(sd)`` and a ``step`` attribute: graded by killing a run. On 2 ranks the unit's
sharded MLP trains with the learner's state to a step drawn for this grading, saves it with
``resilience.save``, and rank 1 kills itself (SIGKILL); a new launch builds everything afresh
(seeds and all), loads the checkpoint into a new ``MyTrainState`` and trains to the end. Every
loss after the resume must equal the uninterrupted run's, bit for bit.
Task 2: find the bug: a gradient-norm clip that computes the norm from the rank's own shard.
``clip_grad_norm_sharded(shards, max_norm) -> total_norm`` scales this rank's gradient shards in
place by min(1, max_norm / (norm + 1e-6)) with the norm of the *whole* gradient; graded on 2 ranks
with shards drawn for this grading (one rank's shard of one tensor empty).
Task 3: ``smallest_cluster(save_s, restart_s) -> gpus``: the smallest cluster whose goodput, at
Young's interval and with Daly's expected wall time (restart cost included), falls below 90 % at
Llama 3 405B's per-GPU failure rate (419 unexpected interruptions in 54 days on 16,384 GPUs);
three (save, restart) pairs drawn for this grading; one GPU either way allowed.
Task 4 (``checks_overlap``): the largest data-parallel world size at which a fixed global batch
still hides the gradient all-reduce (the size an elastic restart may grow back to).

Each check is split (:mod:`course_lib.grading.split`): ``collect_X`` runs the learner's code (on
ranks for tasks 1 and 2) and hands back what it produced: the losses of the resumed run, the
returned norms and the shards as the clip left them, the predictions; ``judge_X`` runs the
uninterrupted reference run (task 1, on its own ranks) or computes the answers, and compares.
"""

from __future__ import annotations

from typing import Any

from course_lib.grading.core import error_pair, fail, launch_learner, passed, refuse, run_learner
from course_lib.grading.plain import learner_value
from course_lib.grading.seeds import case_rng
from course_lib.grading.split import need, need_list, split_check
from course_lib.units.u18_failures_and_checkpoints.checks_overlap import check_dp_overlap

__all__ = [
    "STATE_REFERENCES",
    "CLIP_REFERENCES",
    "PREDICT_REFERENCES",
    "check_train_state",
    "check_clip",
    "check_cluster",
    "check_dp_overlap",
]

UNIT = "u18_failures_and_checkpoints"
GRADE_TIMEOUT_S = 60.0

#: the course's answers to task 1, out of reach while the learner's state saves and loads
STATE_REFERENCES = (
    "course_lib.resilience.state:TrainState.state_dict",
    "course_lib.resilience.state:TrainState.load_state_dict",
    "course_lib.resilience.state:rng_state",
    "course_lib.resilience.state:set_rng_state",
)
CLIP_REFERENCES = ("course_lib.units.u18_failures_and_checkpoints.run_trouble:_norm_rank",)
PREDICT_REFERENCES = (
    "course_lib.measure.estimate.failures:optimal_interval",
    "course_lib.measure.estimate.failures:goodput",
    "course_lib.measure.estimate.failures:job_mtbf",
    "course_lib.units.u18_failures_and_checkpoints.run_scale:gpu_mtbf_s",
    "course_lib.units.u18_failures_and_checkpoints.run_scale:scale_table",
)


# --------------------------------------------------------------------------------------------
# task 1: a TrainState that resumes bit for bit
# --------------------------------------------------------------------------------------------
def _state_worker(rank, world_size, cls, forbid, root, phase, cut, steps) -> dict:
    import os
    import pathlib
    import signal

    from course_lib import resilience
    from course_lib.grading.references import watch_references
    from course_lib.units.u18_failures_and_checkpoints import _train as T

    path, used = pathlib.Path(root) / "ckpt", []
    out: dict[str, Any] = {}
    try:
        with watch_references(forbid) as used:
            base = T.build(steps=steps)
            state = cls(base.model, base.optimizer, base.scheduler, base.data)
            data = T.make_data()
            if phase == "resume":
                resilience.load(state, path)
                out["resumed_at"] = int(state.step)
            losses = []
            while state.step < (cut if phase == "first" else steps):
                losses.append(T.train_step(state, data))
            out["losses"] = losses
            if phase == "first":
                resilience.save(state, path)
    except Exception as exc:  # noqa: BLE001 - reported in the verdict
        return {"used": list(used), "error": error_pair(exc)}
    if phase == "first" and rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)  # the failure: no clean-up
    return {"used": list(used), **out}


def _reference_worker(rank, world_size, steps) -> list[float]:
    """The uninterrupted run, with the course's own state: every step's loss."""
    from course_lib.units.u18_failures_and_checkpoints import _train as T

    data = T.make_data()
    ref = T.build(steps=steps)
    return [T.train_step(ref, data) for _ in range(steps)]


def _state_cut(task: int) -> tuple[int, int]:
    """The step the run is killed after, drawn for this grading, and the run's length."""
    cut = case_rng(task, UNIT).randint(3, 8)
    return cut, cut + 4


def collect_train_state(cls, task: int = 1) -> dict[str, Any]:
    """Kill a run after a step drawn for this grading and resume it with ``cls``; every loss
    after the resume must be the uninterrupted run's, bit for bit."""
    import tempfile

    from course_lib.runtime.errors import LaunchError
    from course_lib.runtime.launch import launch

    cut, steps = _state_cut(task)
    with tempfile.TemporaryDirectory(prefix="u18_task1_") as root:
        args = (cls, STATE_REFERENCES, root)
        try:
            first = launch(_state_worker, 2, *args, "first", cut, steps, timeout=GRADE_TIMEOUT_S)
        except LaunchError as exc:
            if sorted(exc.failures) != [1]:
                fail(task, f"the first run did not reach its save: {exc.failures}")
        else:  # nobody was killed: the learner's code failed before the save
            for res in first:
                if res.get("used"):
                    refuse(task, res["used"])
                if res.get("error"):
                    fail(task, f"saving raised {res['error'][0]}: {res['error'][1]}")
        resumed = launch_learner(
            task, _state_worker, 2, *args, "resume", cut, steps, timeout=GRADE_TIMEOUT_S
        )[0]
    return {"resumed_at": resumed.get("resumed_at"), "losses": resumed.get("losses")}


def judge_train_state(data: Any, task: int = 1) -> None:
    from course_lib.runtime.launch import launch

    cut, steps = _state_cut(task)
    resumed_at = need(task, data, "resumed_at", int, "step after the resume")
    losses = need(task, data, "losses", list, "losses of the resumed run")
    reference = launch(_reference_worker, 2, steps, timeout=GRADE_TIMEOUT_S)[0]
    _judge_resume(task, {"resumed_at": resumed_at, "losses": losses, "reference": reference}, cut)
    passed(
        task,
        "a run killed after its checkpoint and resumed on 2 ranks: step, and every loss after "
        "the resume, equal to the uninterrupted run's, bit for bit",
    )


def _judge_resume(task: int, res: dict, cut: int) -> None:
    if res["resumed_at"] != cut:
        fail(task, f"after load_state_dict, step = {res['resumed_at']}: the run was saved at {cut}")
    got, want = res["losses"], res["reference"][cut:]
    if len(got) != len(want):
        fail(task, f"the resumed run trained {len(got)} steps, expected {len(want)}")
    for i, (g, w) in enumerate(zip(got, want)):
        if not isinstance(g, float) or g != w:
            fail(
                task,
                f"loss of step {cut + i + 1}: resumed {g!r}, uninterrupted {w!r} (which part of "
                "the state was not saved or not put back?)",
            )


check_train_state = split_check(collect_train_state, judge_train_state)


# --------------------------------------------------------------------------------------------
# task 2: the gradient-norm clip of a sharded run
# --------------------------------------------------------------------------------------------
def _clip_cases(task: int) -> list[tuple[str, list[tuple[int, ...]], float]]:
    rng = case_rng(task, UNIT)
    shapes = [(rng.choice((6, 10, 14)), rng.choice((3, 5))), (rng.choice((5, 7, 9)),), (1, 4)]
    return [("norm above max_norm", shapes, 0.5 + rng.random()), ("below it", shapes, 1e4)]


def _clip_seed(task: int) -> int:
    return case_rng(task, UNIT).getrandbits(31)


def _full_gradients(shapes: list[tuple[int, ...]], seed: int) -> list:
    """The whole gradients of a case: the same on every rank (and on the judge's side)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=gen) for s in shapes]


def _clip_worker(rank, world_size, fn, forbid, cases, seed) -> dict:
    from course_lib.grading.references import watch_references

    out, used = [], []
    try:
        with watch_references(forbid) as used:
            for _, shapes, max_norm in cases:
                full = _full_gradients(shapes, seed)
                shards = [g.tensor_split(world_size, dim=0)[rank].clone() for g in full]
                total = fn(shards, max_norm)
                out.append({"total": float(total), "shards": list(shards)})
    except Exception as exc:  # noqa: BLE001 - reported in the verdict
        return {"used": list(used), "error": error_pair(exc)}
    return {"used": list(used), "cases": out}


#: the ranks task 2 runs on
CLIP_RANKS = 2


def collect_clip(clip_grad_norm_sharded, task: int = 2) -> list[Any]:
    """On 2 ranks, each holding dim-0 shards of the same gradients (one of them 1 row, so one
    rank's shard is empty): the returned norm is the whole gradient's and every shard is scaled
    by the same factor."""
    ranks = launch_learner(
        task,
        _clip_worker,
        CLIP_RANKS,
        clip_grad_norm_sharded,
        CLIP_REFERENCES,
        _clip_cases(task),
        _clip_seed(task),
        timeout=GRADE_TIMEOUT_S,
    )
    return [res.get("cases") for res in ranks]


def _scaled_right(got: Any, full: list, rank: int, scale: float) -> bool:
    """Whether the shards handed back are this rank's shards of ``full`` times ``scale``."""
    import torch

    if not isinstance(got, list) or len(got) != len(full):
        return False
    for s, g in zip(got, full):
        want = g.tensor_split(CLIP_RANKS, dim=0)[rank] * scale
        if not isinstance(s, torch.Tensor) or s.shape != want.shape or s.dtype != want.dtype:
            return False
        if not torch.allclose(s, want, rtol=1e-5):
            return False
    return True


def judge_clip(data: Any, task: int = 2) -> None:
    import torch

    cases, seed = _clip_cases(task), _clip_seed(task)
    if not isinstance(data, list) or len(data) != CLIP_RANKS:
        fail(task, f"the run handed back no results of its {CLIP_RANKS} ranks")
    for rank, res in enumerate(data):
        if not isinstance(res, list) or len(res) != len(cases):
            fail(task, f"rank {rank} handed back no result for each of the {len(cases)} cases")
        for (what, shapes, max_norm), got in zip(cases, res):
            full = _full_gradients(shapes, seed)
            norm = float(torch.stack([(g.double() ** 2).sum() for g in full]).sum().sqrt())
            total = need(task, got, "total", float, f"norm of rank {rank}")
            if not abs(total - norm) <= 1e-5 * norm:  # a NaN norm is not it either
                fail(
                    task,
                    f"rank {rank}, {what}: returned norm {total:.6g}, the whole gradient's "
                    f"is {norm:.6g} (a norm of this rank's shard only?)",
                )
            if not _scaled_right(got.get("shards"), full, rank, min(1.0, max_norm / (norm + 1e-6))):
                fail(
                    task,
                    f"rank {rank}, {what} (max_norm {max_norm:.3g}): the shards are not scaled by "
                    "min(1, max_norm / (norm + 1e-6)) of the whole gradient's norm",
                )
    passed(
        task, "the norm of the whole gradient on every rank (shards all-reduced), one clip scale"
    )


check_clip = split_check(collect_clip, judge_clip)


# --------------------------------------------------------------------------------------------
# task 3: the cluster size at which goodput falls below 90 %
# --------------------------------------------------------------------------------------------
def _goodput(gpus: int, save_s: float, restart_s: float) -> float:
    """Goodput at Young's interval for ``gpus`` GPUs at Llama 3 405B's per-GPU failure rate."""
    from course_lib.measure import estimate

    mtbf = estimate.job_mtbf(54 * 86400, 419) * 16384 / gpus
    tau = estimate.optimal_interval(save_s, mtbf)
    return estimate.goodput(tau, save_s, mtbf, restart_s=restart_s)


def _smallest_cluster(save_s: float, restart_s: float, target: float = 0.9) -> int:
    """The smallest GPU count whose goodput is below ``target`` (goodput falls as GPUs grow)."""
    lo, hi = 1, 2
    while _goodput(hi, save_s, restart_s) >= target:
        lo, hi = hi, hi * 2
    while hi - lo > 1:  # goodput(lo) >= target > goodput(hi)
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if _goodput(mid, save_s, restart_s) >= target else (lo, mid)
    return hi


def _cluster_cases(task: int) -> list[tuple[float, float]]:
    """Three (save_s, restart_s) pairs: saves of 1-60 s, restarts of 1-15 minutes; never the
    lecture's 10-minute restart with a 2.83 s save."""
    rng = case_rng(task, UNIT)
    return [(rng.randint(2, 120) / 2, rng.choice((60.0, 120.0, 300.0, 420.0, 900.0)))
            for _ in range(3)]  # fmt: skip


def collect_cluster(smallest_cluster, task: int = 3) -> list[Any]:
    """``smallest_cluster(save_s, restart_s) -> gpus``: the smallest cluster, at Llama 3's
    failure rate per GPU with Young's interval, whose goodput is below 90 %; three drawn cases,
    each exact (one GPU either way allowed: the goodput at the boundary is a float)."""
    answers = []
    for save_s, restart_s in _cluster_cases(task):
        got = run_learner(task, smallest_cluster, save_s, restart_s, forbid=PREDICT_REFERENCES)
        answers.append(learner_value(got, builtin_only=True))
    return answers


def judge_cluster(answers: Any, task: int = 3) -> None:
    cases = _cluster_cases(task)
    need_list(task, answers, len(cases), "answer")
    for (save_s, restart_s), got in zip(cases, answers):
        call = f"smallest_cluster({save_s}, {restart_s})"
        if not isinstance(got, int) or isinstance(got, bool):
            fail(task, f"{call}: expected an int (GPUs), got {got!r}")
        want = _smallest_cluster(save_s, restart_s)
        if abs(got - want) > 1:
            where = "still at or above" if got < want else "already well below"
            fail(task, f"{call} = {got:,}: at that size goodput is {where} 90 %")
    passed(
        task,
        "the cluster size at which goodput falls below 90 %, at three drawn save and restart times",
    )


check_cluster = split_check(collect_cluster, judge_cluster)
