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
"""

from __future__ import annotations

from course_lib.grading.core import expect_int, fail, passed, run_learner
from course_lib.units.u02_batch_size_and_accumulation.checks_accumulation import (  # noqa: F401 (re-exported)
    _ACCUMULATION_REFERENCES,
    UNEVEN_BUG_CHOICES,
    check_accumulation_step,
    check_uneven_accumulation,
)

#: the course's own answers, out of reach while the learner's function runs
_INTENSITY_REFERENCES = (
    "course_lib.measure.estimate.compute:matmul_arithmetic_intensity",
    "course_lib.measure.estimate.compute:arithmetic_intensity",
    "course_lib.measure.estimate.compute:matmul_flops",
    "course_lib.measure.estimate.compute:matmul_bytes",
)

# ---------------------------------------------------------------------------------- task 1


def check_matmul_intensity(matmul_intensity, task: int = 1) -> None:
    """Task: FLOP per byte of an (m x k) @ (k x n) matmul that reads A, B and writes C once."""
    from course_lib.measure import estimate

    cases = [
        (1, 4096, 4096, 4),
        (8, 4096, 4096, 2),
        (512, 512, 512, 4),
        (4096, 4096, 4096, 2),
        (3, 5, 7, 8),
    ]
    for m, n, k, b in cases:
        expected = estimate.matmul_arithmetic_intensity(m, n, k, dtype_bytes=b)
        got = run_learner(task, matmul_intensity, m, n, k, b, forbid=_INTENSITY_REFERENCES)
        try:
            ok = abs(float(got) - expected) <= 1e-9 * expected
        except (TypeError, ValueError):
            ok = False
        if not ok:
            hint = ""
            if isinstance(got, (int, float)) and abs(float(got) - expected / 2) <= 1e-9 * expected:
                hint = " (a multiply-add is 2 FLOP: the matmul does 2mnk FLOP)"
            fail(
                task,
                f"m={m}, n={n}, k={k}, dtype_bytes={b}: expected {expected:.6g} FLOP/B, "
                f"got {got!r}{hint}",
            )
    passed(task, "matmul intensity matches estimate on 5 shapes (a batch-1 matvec: < 1 FLOP/B)")


# ---------------------------------------------------------------------------------- task 2
def _plan_reference(target_batch: int, max_micro_batch: int, world_size: int) -> tuple[int, int]:
    per_rank = target_batch // world_size
    micro = max(d for d in range(1, min(max_micro_batch, per_rank) + 1) if per_rank % d == 0)
    return micro, per_rank // micro


def _check_indivisible_refused(plan_accumulation, task: int) -> None:
    """100 samples do not split over 3 ranks: the learner's plan must raise ValueError."""
    try:
        plan_accumulation(100, 8, 3)
    except ValueError:
        pass
    except NotImplementedError:
        fail(task, "not implemented yet: plan_accumulation raised NotImplementedError")
    except Exception as exc:  # noqa: BLE001 - learner error becomes a verdict
        fail(
            task, f"target=100, world_size=3: expected ValueError, got {type(exc).__name__}: {exc}"
        )
    else:
        fail(
            task,
            "target=100, world_size=3: 100 samples do not split over 3 ranks; expected a "
            "ValueError, got no error",
        )


def check_plan_accumulation(plan_accumulation, task: int = 2) -> None:
    """Task: (micro_batch, accumulation_steps) with micro x steps x ranks = target, fewest steps."""
    cases = [(512, 64, 1), (512, 64, 4), (1024, 48, 8), (96, 7, 2), (256, 512, 1), (60, 60, 3)]
    for target, max_micro, ranks in cases:
        expected = _plan_reference(target, max_micro, ranks)
        got = run_learner(
            task, plan_accumulation, target, max_micro, ranks, forbid=_ACCUMULATION_REFERENCES
        )
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
            f"{where}: expected {expected} (the largest micro-batch that fits, so the "
            f"fewest accumulation steps), got {got!r}",
        )
    _check_indivisible_refused(plan_accumulation, task)
    passed(task, f"plans match on {len(cases)} cases and an indivisible target raises ValueError")


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


def _fit_cases():
    """(MLP, budget in bytes): shapes and budgets the lecture did not show."""
    import torch

    from course_lib.models import MLP, MLPConfig

    out = []
    for seed, (cfg, mib) in enumerate(
        [
            (MLPConfig(in_features=48, hidden=(160, 160), out_features=7), 3),
            (MLPConfig(in_features=64, hidden=(256,), out_features=4), 4),
        ]
    ):
        torch.manual_seed(seed)
        out.append((MLP(cfg), mib * 2**20))
    return out


def _step_peak(model, batch: int) -> int:
    """Measured peak bytes of one SGD step at `batch`, the input batch and labels included."""
    from course_lib.units.u02_batch_size_and_accumulation.run import step_peak_bytes

    return int(step_peak_bytes(model, batch, optimizer="sgd", device="cpu")["peak_bytes"])


def check_largest_batch(largest_batch, task: int = 4) -> None:
    """Task (predict, then measure): the learner's batch must fit the budget when measured, and a
    batch 3 % larger must not."""
    for model, budget in _fit_cases():
        got = run_learner(task, largest_batch, model, budget, forbid=_FIT_REFERENCES)
        expect_int(task, "the batch size", got)
        where = f"MLP widths={model.config.widths}, budget {budget:,} B"
        if got < 1:
            fail(task, f"{where}: expected a batch of at least 1, got {got}")
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


# ---------------------------------------------------------------------------------- task 6
_GPU_REFERENCES = (
    "course_lib.measure.estimate.training:gpus_for_training",
    "course_lib.measure.estimate.training:training_days",
    "course_lib.measure.estimate.training:training_flops_per_token",
)


def gpu_cases():
    """(label, n_params, tokens, days, peak FLOP/s, MFU): the sources' worked example on three
    GPU generations, and 7B / 70B runs on 2T tokens."""
    from course_lib.measure import estimate

    peak = {name: estimate.gpu_spec(name).peak_flops for name in ("V100", "A100", "H100")}
    return [
        ("175B, 300B tokens, 30 days, V100", 175 * 10**9, 300 * 10**9, 30, peak["V100"], 0.5),
        ("175B, 300B tokens, 30 days, A100", 175 * 10**9, 300 * 10**9, 30, peak["A100"], 0.5),
        ("175B, 300B tokens, 30 days, H100", 175 * 10**9, 300 * 10**9, 30, peak["H100"], 0.5),
        ("7B, 2T tokens, 7 days, H100 at 40 %", 7 * 10**9, 2 * 10**12, 7, peak["H100"], 0.4),
        ("70B, 2T tokens, 30 days, H100 at 40 %", 70 * 10**9, 2 * 10**12, 30, peak["H100"], 0.4),
    ]


def check_gpus_needed(gpus_needed, task: int = 6) -> None:
    """Task (scale it up): whole GPUs to train a model on a token budget in a given time."""
    from course_lib.measure import estimate

    answers = []
    for label, n, tokens, days, peak, util in gpu_cases():
        expected = estimate.gpus_for_training(n, tokens, days=days, peak_flops=peak, mfu=util)
        got = run_learner(task, gpus_needed, n, tokens, days, peak, util, forbid=_GPU_REFERENCES)
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
            fail(task, f"{label}: expected {expected:,} GPUs, got {got!r}{hint}")
        answers.append(got)
    passed(
        task,
        f"175B on 300B tokens in 30 days at 50 % MFU: {answers[0]:,} V100, {answers[1]:,} A100, "
        f"{answers[2]:,} H100; 7B and 70B on 2T tokens match too",
    )
