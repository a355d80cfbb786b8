"""Checks for the exercises of unit 02 (solutions/02_batch_size_and_accumulation.ipynb).

Task 1: arithmetic intensity of a matmul (FLOP per byte), against estimate.
Task 2: plan micro-batch and accumulation steps for a target effective batch.
Task 3: the gradient-accumulation loop. The check runs the learner's loop on a small MLP it builds
itself, spies on the optimizer and on the loss, and compares the update with one full-batch step;
then it calls the loop a second time on a new batch, as a training loop does, and compares again.
It names the classic bugs: the loss not divided by the number of micro-batches, zero_grad inside
the loop, stepping the optimizer every micro-batch, and never clearing the gradients.
Task 4 (predict, then measure): the largest batch whose SGD step fits a memory budget; the check
measures the learner's batch and one 3 % larger.
Task 5 (find the bug): an accumulation loop that weights unequal micro-batches equally.
Task 6 (scale it up): GPUs needed to train 7B-175B models in a given time, against estimate.

Every check draws the cases it asks about from the grading seed
(:func:`course_lib.grading.seeds.case_rng`): shapes, batch targets, budgets, runs. The edge cases
stay (a batch-1 matvec, a micro-batch limit above the per-rank batch, a prime per-rank batch, an
indivisible target, uneven micro-batches), with drawn numbers.

Each check is split (:mod:`course_lib.grading.split`): ``collect_X`` runs the learner's code on
the drawn cases and hands back what it returned, what it did to the model and what the spies saw;
``judge_X`` draws the cases again, computes what is expected (estimate, a full-batch step, a
measured step) and compares. Tasks 3 and 5 are in :mod:`.checks_accumulation` and
:mod:`.checks_uneven`.
"""

from __future__ import annotations

from typing import Any

from course_lib.grading.core import expect_int, fail, passed, run_learner
from course_lib.grading.seeds import case_rng
from course_lib.grading.split import need, need_list, split_check
from course_lib.units.u02_batch_size_and_accumulation.checks_accumulation import (  # noqa: F401 (re-exported)
    _ACCUMULATION_REFERENCES,
    check_accumulation_step,
)
from course_lib.units.u02_batch_size_and_accumulation.checks_uneven import (  # noqa: F401 (re-exported)
    UNEVEN_BUG_CHOICES,
    check_uneven_accumulation,
)

UNIT = "u02_batch_size_and_accumulation"

#: the course's own answers, out of reach while the learner's function runs
_INTENSITY_REFERENCES = (
    "course_lib.measure.estimate.compute:matmul_arithmetic_intensity",
    "course_lib.measure.estimate.compute:arithmetic_intensity",
    "course_lib.measure.estimate.compute:matmul_flops",
    "course_lib.measure.estimate.compute:matmul_bytes",
)

# ---------------------------------------------------------------------------------- task 1


def _intensity_cases(task: int) -> list[tuple[int, int, int, int]]:
    """(m, n, k, dtype_bytes) drawn from the grading seed, the edges kept."""
    rng = case_rng(task, UNIT)
    big = [rng.choice((1024, 2048, 3072, 5120, 8192)) for _ in range(5)]
    return [
        (1, big[0], big[1], rng.choice((2, 4))),  # a batch-1 matvec: below 1 FLOP/B
        (rng.randint(2, 32), big[2], big[2], rng.choice((2, 4))),
        (big[3], big[3], big[3], rng.choice((1, 2, 4))),  # square
        (big[4], rng.randint(256, 1024), rng.randint(512, 4096), 2),
        (rng.randint(2, 9), rng.randint(2, 9), rng.randint(2, 9), 8),  # tiny, fp64
    ]


def collect_matmul_intensity(matmul_intensity, task: int = 1) -> list[Any]:
    """Task: FLOP per byte of an (m x k) @ (k x n) matmul that reads A, B and writes C once."""
    return [
        run_learner(task, matmul_intensity, m, n, k, b, forbid=_INTENSITY_REFERENCES)
        for m, n, k, b in _intensity_cases(task)
    ]


def judge_matmul_intensity(data: Any, task: int = 1) -> None:
    from course_lib.measure import estimate

    cases = _intensity_cases(task)
    for (m, n, k, b), got in zip(cases, need_list(task, data, len(cases), "answer")):
        expected = estimate.matmul_arithmetic_intensity(m, n, k, dtype_bytes=b)
        try:
            ok = abs(float(got) - expected) <= 1e-9 * expected
        except (TypeError, ValueError, RuntimeError):
            ok = False
        if not ok:
            hint = ""
            if isinstance(got, (int, float)) and abs(float(got) - expected / 2) <= 1e-9 * expected:
                hint = " (a multiply-add is 2 FLOP: the matmul does 2mnk FLOP)"
            fail(
                task,
                f"m={m}, n={n}, k={k}, dtype_bytes={b}: {got!r} FLOP/B is not this matmul's "
                f"intensity{hint}",
            )
    passed(task, "matmul intensity matches estimate on 5 shapes (a batch-1 matvec: < 1 FLOP/B)")


check_matmul_intensity = split_check(collect_matmul_intensity, judge_matmul_intensity)


# ---------------------------------------------------------------------------------- task 2
def _plan_reference(target_batch: int, max_micro_batch: int, world_size: int) -> tuple[int, int]:
    per_rank = target_batch // world_size
    micro = max(d for d in range(1, min(max_micro_batch, per_rank) + 1) if per_rank % d == 0)
    return micro, per_rank // micro


def _plan_cases(task: int) -> tuple[list[tuple[int, int, int]], tuple[int, int, int]]:
    """(target, max_micro_batch, world_size) cases drawn from the grading seed, and one target
    that does not split over its ranks. The edges: one rank with an exact fit, a limit that
    divides nothing useful, a limit above the per-rank batch, a prime per-rank batch, an odd
    limit, a per-rank batch equal to the limit."""
    rng = case_rng(task, UNIT)
    ranks = [rng.choice((2, 4, 8)) for _ in range(5)]
    micro = rng.choice((16, 32, 64))
    per_rank = rng.choice((96, 128, 160, 192))
    prime = rng.choice((13, 17, 19, 23, 29))
    cases = [
        (micro * rng.randint(2, 16), micro, 1),  # one rank, the limit divides: an exact fit
        (per_rank * ranks[0], rng.choice((36, 40, 48, 56)), ranks[0]),
        (rng.randint(8, 100) * ranks[1], 512, ranks[1]),  # the limit is above the per-rank batch
        (prime * ranks[2], rng.randint(4, prime - 1), ranks[2]),  # prime: micro-batches of 1
        (rng.choice((42, 48, 60, 72, 84)) * ranks[3], rng.choice((5, 7, 9, 11)), ranks[3]),
        ((p := rng.randint(10, 70)) * 3, p, 3),  # the per-rank batch equals the limit
    ]
    world = rng.choice((3, 5, 6, 7))
    indivisible = (world * rng.randint(10, 40) + rng.randint(1, world - 1), 8, world)
    return cases, indivisible


def _indivisible_outcome(plan_accumulation, case: tuple[int, int, int]) -> dict[str, Any]:
    """What the plan does when ``target`` samples do not split over ``world`` ranks: the error
    it raised (its kind, type and message), or none."""
    try:
        plan_accumulation(*case)
    except ValueError as exc:
        return {"raised": "ValueError", "type": type(exc).__name__, "message": str(exc)[:300]}
    except NotImplementedError as exc:
        return {"raised": "NotImplementedError", "type": type(exc).__name__, "message": ""}
    except Exception as exc:  # noqa: BLE001 - a learner's error is data for the judge
        return {"raised": "other", "type": type(exc).__name__, "message": str(exc)[:300]}
    return {"raised": None, "type": "", "message": ""}


def _judge_indivisible(task: int, outcome: Any, case: tuple[int, int, int]) -> None:
    """The plan must have raised ValueError on the indivisible target (fails otherwise)."""
    target, _, world = case
    raised = outcome.get("raised", "?") if isinstance(outcome, dict) else "?"
    if raised == "ValueError":
        return
    if raised == "NotImplementedError":
        fail(task, "not implemented yet: plan_accumulation raised NotImplementedError")
    if raised == "other":
        kind, message = (str(outcome.get(k, ""))[:300] for k in ("type", "message"))
        fail(
            task,
            f"target={target}, world_size={world}: expected ValueError, got {kind}: {message}",
        )
    if raised is None:
        fail(
            task,
            f"target={target}, world_size={world}: {target} samples do not split over {world} "
            "ranks; expected a ValueError, got no error",
        )
    fail(task, f"the run handed back no outcome for target={target} (got {raised!r:.80})")


def collect_plan_accumulation(plan_accumulation, task: int = 2) -> dict[str, Any]:
    """Task: (micro_batch, accumulation_steps) with micro x steps x ranks = target, fewest steps."""
    cases, indivisible = _plan_cases(task)
    plans = [
        run_learner(
            task, plan_accumulation, target, max_micro, ranks, forbid=_ACCUMULATION_REFERENCES
        )
        for target, max_micro, ranks in cases
    ]
    return {"plans": plans, "indivisible": _indivisible_outcome(plan_accumulation, indivisible)}


def judge_plan_accumulation(data: Any, task: int = 2) -> None:
    cases, indivisible = _plan_cases(task)
    plans = need_list(task, need(task, data, "plans", list, "plans"), len(cases), "plan")
    for (target, max_micro, ranks), got in zip(cases, plans):
        expected = _plan_reference(target, max_micro, ranks)
        try:
            got_t = tuple(got)
        except (TypeError, ValueError):
            fail(
                task,
                f"target={target}, max_micro_batch={max_micro}, world_size={ranks}: "
                f"expected a (micro_batch, accumulation_steps) pair, got {got!r}",
            )
        for v in got_t:
            expect_int(task, "micro_batch and accumulation_steps", v)
        if got_t == expected:
            continue
        where = f"target={target}, max_micro_batch={max_micro}, world_size={ranks}"
        if len(got_t) == 2 and got_t[0] * got_t[1] * ranks != target:
            fail(
                task,
                f"{where}: micro_batch x accumulation_steps x world_size = "
                f"{got_t[0]} x {got_t[1]} x {ranks} = {got_t[0] * got_t[1] * ranks}, "
                f"not the target {target}",
            )
        if len(got_t) == 2 and got_t[0] > max_micro:
            fail(task, f"{where}: micro_batch {got_t[0]} exceeds max_micro_batch {max_micro}")
        fail(
            task,
            f"{where}: {got!r} is a valid split, but not the largest micro-batch that fits "
            "(so not the fewest accumulation steps)",
        )
    _judge_indivisible(task, data.get("indivisible"), indivisible)
    passed(task, f"plans match on {len(cases)} cases and an indivisible target raises ValueError")


check_plan_accumulation = split_check(collect_plan_accumulation, judge_plan_accumulation)


# ---------------------------------------------------------------------------------- task 4
_FIT_REFERENCES = (
    "course_lib.units.u02_batch_size_and_accumulation.run:largest_batch_that_fits",
    "course_lib.units.u02_batch_size_and_accumulation.run:step_peak_bytes",
    "course_lib.measure.memory:MemoryMeter",
    "course_lib.measure.estimate.activations:activation_bytes_mlp",
    "course_lib.measure.estimate.memory:model_state_bytes",
)
#: a batch this much larger than the learner's must NOT fit (the tolerance of the prediction)
FIT_TOLERANCE = 0.03


def _fit_cases(task: int):
    """(MLP, budget in bytes): shapes and budgets the lecture did not show, drawn from the
    grading seed (a deep narrow MLP and a shallow wide one)."""
    import torch

    from course_lib.models import MLP, MLPConfig

    rng = case_rng(task, UNIT)
    deep = MLPConfig(
        in_features=rng.randint(24, 80),
        hidden=(rng.randint(96, 200),) * rng.randint(2, 3),
        out_features=rng.randint(3, 12),
    )
    wide = MLPConfig(
        in_features=rng.randint(32, 96),
        hidden=(rng.randint(192, 320),),
        out_features=rng.randint(2, 8),
    )
    out = []
    for cfg in (deep, wide):
        torch.manual_seed(rng.getrandbits(31))
        out.append((MLP(cfg), rng.randint(5 * 2**19, 9 * 2**19)))  # 2.5 to 4.5 MiB
    return out


def _step_peak(model, batch: int) -> int:
    """Measured peak bytes of one SGD step at `batch`, the input batch and labels included."""
    from course_lib.units.u02_batch_size_and_accumulation.run import step_peak_bytes

    return int(step_peak_bytes(model, batch, optimizer="sgd", device="cpu")["peak_bytes"])


def collect_largest_batch(largest_batch, task: int = 4) -> list[Any]:
    """Task (predict, then measure): the learner's batch must fit the budget when measured, and a
    batch 3 % larger must not."""
    return [
        run_learner(task, largest_batch, model, budget, forbid=_FIT_REFERENCES)
        for model, budget in _fit_cases(task)
    ]


def judge_largest_batch(data: Any, task: int = 4) -> None:
    cases = _fit_cases(task)
    for (model, budget), got in zip(cases, need_list(task, data, len(cases), "answer")):
        expect_int(task, "the batch size", got)
        where = f"MLP widths={model.config.widths}, budget {budget:,} B"
        if got < 1:
            fail(task, f"{where}: expected a batch of at least 1, got {got}")
        inputs = got * (4 * model.config.in_features + 8)  # the fp32 batch and its int64 labels
        if inputs > budget:  # measured, it would not fit either: the input is part of the peak
            fail(
                task,
                f"{where}: batch {got} does not fit: its input batch and labels alone take "
                f"{inputs:,} B, {inputs - budget:,} B over",
            )
        peak = _step_peak(model, got)
        if peak > budget:
            fail(
                task,
                f"{where}: batch {got} does not fit: its measured peak is {peak:,} B, "
                f"{peak - budget:,} B over (the peak is early in backward: what is alive there?)",
            )
        bigger = max(got + 1, int(got * (1 + FIT_TOLERANCE)))
        peak_bigger = _step_peak(model, bigger)
        if peak_bigger <= budget:
            fail(
                task,
                f"{where}: batch {got} fits, but so does {bigger} (measured peak "
                f"{peak_bigger:,} B): the prediction is more than {FIT_TOLERANCE:.0%} too cautious",
            )
    passed(
        task,
        f"on 2 unseen MLPs your batch fits the budget when measured and one "
        f"{FIT_TOLERANCE:.0%} larger does not",
    )


check_largest_batch = split_check(collect_largest_batch, judge_largest_batch)


# ---------------------------------------------------------------------------------- task 6
_GPU_REFERENCES = (
    "course_lib.measure.estimate.training:gpus_for_training",
    "course_lib.measure.estimate.training:training_days",
    "course_lib.measure.estimate.training:training_flops_per_token",
)


def gpu_cases(task: int = 6):
    """(label, n_params, tokens, days, peak FLOP/s, MFU): the sources' worked example on three
    GPU generations, and two runs drawn from the grading seed (size, tokens, days, GPU, MFU)."""
    from course_lib.measure import estimate

    peak = {name: estimate.gpu_spec(name).peak_flops for name in ("V100", "A100", "H100")}
    cases = [
        (f"175B, 300B tokens, 30 days, {gpu}", 175 * 10**9, 300 * 10**9, 30, peak[gpu], 0.5)
        for gpu in ("V100", "A100", "H100")
    ]
    rng = case_rng(task, UNIT)
    for low, high in ((1, 30), (30, 400)):
        n = rng.randint(low, high) * 10**9
        tokens = rng.randint(2, 150) * 10**11
        days, gpu, mfu = rng.randint(5, 90), rng.choice(("A100", "H100")), rng.randint(25, 55) / 100
        label = f"{n / 1e9:g}B, {tokens / 1e12:g}T tokens, {days} days, {gpu} at {mfu:.0%}"
        cases.append((label, n, tokens, days, peak[gpu], mfu))
    return cases


def collect_gpus_needed(gpus_needed, task: int = 6) -> list[Any]:
    """Task (scale it up): whole GPUs to train a model on a token budget in a given time."""
    return [
        run_learner(task, gpus_needed, n, tokens, days, peak, util, forbid=_GPU_REFERENCES)
        for _, n, tokens, days, peak, util in gpu_cases(task)
    ]


def judge_gpus_needed(data: Any, task: int = 6) -> None:
    from course_lib.measure import estimate

    cases = gpu_cases(task)
    answers = need_list(task, data, len(cases), "answer")
    for (label, n, tokens, days, peak, util), got in zip(cases, answers):
        expected = estimate.gpus_for_training(n, tokens, days=days, peak_flops=peak, mfu=util)
        expect_int(task, f"the GPU count ({label})", got)
        if got != expected:
            exact = 6 * n * tokens / (days * 86_400 * peak * util)
            hint = ""
            if got == round(exact) or got == int(exact):
                hint = " (a fraction of a GPU is a whole GPU: round up)"
            elif abs(got - exact / 3) < 1.5:
                hint = " (training is about 6 FLOPs per parameter per token: 2 forward, 4 backward)"
            elif abs(got - exact * util) < 1.5:
                hint = " (at an MFU below 1 each GPU delivers only that fraction of its peak)"
            fail(task, f"{label}: {got!r} GPUs is not the count that finishes in time{hint}")
    passed(
        task,
        f"175B on 300B tokens in 30 days at 50 % MFU: {answers[0]:,} V100, {answers[1]:,} A100, "
        f"{answers[2]:,} H100; 2 drawn runs match too",
    )


check_gpus_needed = split_check(collect_gpus_needed, judge_gpus_needed)
