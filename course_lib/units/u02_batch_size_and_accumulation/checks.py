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

import copy

from course_lib.grading.core import expect_int, fail, passed, run_learner

#: the course's own answers, out of reach while the learner's function runs
_INTENSITY_REFERENCES = (
    "course_lib.measure.estimate.compute:matmul_arithmetic_intensity",
    "course_lib.measure.estimate.compute:arithmetic_intensity",
    "course_lib.measure.estimate.compute:matmul_flops",
    "course_lib.measure.estimate.compute:matmul_bytes",
)
_ACCUMULATION_REFERENCES = (
    "course_lib.techniques.accumulation:accumulation_step",
    "course_lib.techniques.accumulation:effective_batch",
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
    passed(task, f"plans match on {len(cases)} cases and an indivisible target raises ValueError")


# ---------------------------------------------------------------------------------- task 3
def _spy_optimizer(params, events: list, lr: float):
    """torch.optim.SGD that logs step() and zero_grad() calls into `events`."""
    import torch

    class SpySGD(torch.optim.SGD):
        def step(self, closure=None):
            events.append("step")
            return super().step(closure)

        def zero_grad(self, set_to_none: bool = True):
            events.append("zero_grad")
            return super().zero_grad(set_to_none=set_to_none)

    return SpySGD(params, lr=lr)


def _spy_loss(events: list):
    """Cross-entropy (mean) that logs each call and, via a tensor hook, each backward through it."""
    import torch.nn.functional as F

    def loss_fn(output, target):
        loss = F.cross_entropy(output, target)
        events.append("forward")
        if loss.requires_grad:
            loss.register_hook(lambda g: events.append("backward"))
        return loss

    return loss_fn


def _case(seed: int, batch: int):
    import torch
    from torch import nn

    torch.manual_seed(seed)
    d_in, hidden, classes = 6 + seed, 16 + 4 * seed, 3 + seed
    model = nn.Sequential(nn.Linear(d_in, hidden), nn.Tanh(), nn.Linear(hidden, classes))
    model = model.double()  # float64: the check's tolerance is then far below any bug's effect
    x = torch.randn(batch, d_in, dtype=torch.float64)
    y = torch.randint(0, classes, (batch,))
    return model, x, y


def _flat(params) -> "torch.Tensor":  # noqa: F821
    import torch

    return torch.cat([p.detach().reshape(-1) for p in params])


def _micro_grads(model, x, y, micro_batches: int):
    """Per-micro-batch gradients (mean loss of each micro-batch), flattened."""
    import torch.nn.functional as F

    out = []
    for xb, yb in zip(x.chunk(micro_batches), y.chunk(micro_batches)):
        work = copy.deepcopy(model)
        F.cross_entropy(work(xb), yb).backward()
        out.append(_flat(p.grad for p in work.parameters()))
    return out


_LR = 0.5  # SGD learning rate of the check: the update is lr x gradient
_RTOL = 1e-9


def check_accumulation_step(accumulation_step, task: int = 3) -> None:
    """Task: one optimizer step over `micro_batches` micro-batches = one full-batch step.

    Each case calls the learner's function twice in a row on the same model and optimizer (two
    steps of a training loop, on two batches), so gradients left over from the first call are
    caught. Compared in float64 with rtol=1e-9: summing micro-batch gradients adds the same
    terms in a different order than the full batch does, so the two differ by rounding only
    (~1e-16 relative in float64); every bug below changes the update by a factor of order 1.
    """
    for seed, batch, k in ((0, 12, 3), (1, 16, 4)):
        _check_one_case(accumulation_step, task, seed, batch, k)
    passed(
        task,
        f"2 accumulated steps in a row equal 2 full-batch steps on 2 unseen MLPs "
        f"(float64, rtol={_RTOL:g})",
    )


def _close(a, b, scale: float) -> bool:
    return float((a - b).abs().max()) <= _RTOL * scale


def _full_batch_update(model, x, y):
    """lr x the gradient of the mean loss over the whole batch, at `model`'s parameters."""
    import torch.nn.functional as F

    ref = copy.deepcopy(model)
    ref.zero_grad(set_to_none=True)
    F.cross_entropy(ref(x), y).backward()
    return _LR * _flat(p.grad for p in ref.parameters())


def _check_one_case(accumulation_step, task: int, seed: int, batch: int, k: int) -> None:
    import torch

    model, x, y = _case(seed, batch)
    g = torch.Generator().manual_seed(100 + seed)
    x2 = torch.randn(x.shape, dtype=x.dtype, generator=g)  # the second call's batch
    y2 = torch.randint(0, int(y.max()) + 1, y.shape, generator=g)
    before = _flat(model.parameters())
    # reference: one step on the mean loss over the full batch
    expected_update = _full_batch_update(model, x, y)

    events: list[str] = []
    work = copy.deepcopy(model)
    opt = _spy_optimizer(work.parameters(), events, _LR)
    model_zero_grad = work.zero_grad

    def logged_model_zero_grad(set_to_none: bool = True):
        events.append("zero_grad")
        return model_zero_grad(set_to_none=set_to_none)

    work.zero_grad = logged_model_zero_grad  # model.zero_grad() counts as zero_grad too
    loss_fn = _spy_loss(events)
    run_learner(
        task, accumulation_step, work, opt, loss_fn, x, y, k, forbid=_ACCUMULATION_REFERENCES
    )
    where = f"batch of {batch} in {k} micro-batches"
    _check_events(events, task, where, k)

    update = before - _flat(work.parameters())
    scale = float(expected_update.abs().max())
    if not _close(update, expected_update, scale):
        _diagnose_update(update, expected_update, scale, model, x, y, task, where, k)

    # second call, as the next iteration of a training loop: a new batch, same model and optimizer
    reference = copy.deepcopy(model)  # the untouched original, moved to the learner's parameters
    with torch.no_grad():
        for p, q in zip(reference.parameters(), work.parameters()):
            p.copy_(q)
    expected_update2 = _full_batch_update(reference, x2, y2)
    left_over = _flat(
        p.grad if p.grad is not None else torch.zeros_like(p) for p in work.parameters()
    )
    before2 = _flat(work.parameters())
    events.clear()
    run_learner(
        task, accumulation_step, work, opt, loss_fn, x2, y2, k, forbid=_ACCUMULATION_REFERENCES
    )
    where2 = f"second call (next batch of {batch} in {k} micro-batches)"
    _check_events(events, task, where2, k)
    update2 = before2 - _flat(work.parameters())
    scale2 = float(expected_update2.abs().max())
    if _close(update2, expected_update2, scale2):
        return
    if "zero_grad" not in events and _close(update2, expected_update2 + _LR * left_over, scale2):
        fail(
            task,
            f"{where2}: gradients never cleared: the step also used the gradients the "
            f"first call left in .grad (backward adds into .grad); call "
            f"optimizer.zero_grad() once per call, before the loop",
        )
    _diagnose_update(update2, expected_update2, scale2, reference, x2, y2, task, where2, k)


def _check_events(events: list[str], task: int, where: str, k: int) -> None:
    """Order and number of forward, backward, zero_grad and step calls within one call."""
    n_fwd, n_bwd, n_step = (events.count(e) for e in ("forward", "backward", "step"))
    if n_step == k and k > 1:
        fail(
            task,
            f"{where}: optimizer.step() ran {k} times: stepping every micro-batch "
            f"makes {k} small updates instead of one; step once, after the loop",
        )
    if n_step != 1:
        fail(task, f"{where}: expected optimizer.step() to run once, got {n_step} calls")
    if n_fwd != k or n_bwd != k:
        fail(
            task,
            f"{where}: expected {k} forward and {k} backward passes (one per "
            f"micro-batch), got {n_fwd} forward and {n_bwd} backward",
        )
    passes = [e for e in events if e in ("forward", "backward")]
    if passes != ["forward", "backward"] * k:
        fail(
            task,
            f"{where}: backward must follow each micro-batch's forward (got the order "
            f"{' '.join(passes)}); one backward after all forwards keeps every "
            f"micro-batch's activations alive, as much memory as the full batch",
        )
    first_bwd = events.index("backward")
    last_bwd = len(events) - 1 - events[::-1].index("backward")
    if "zero_grad" in events[first_bwd:last_bwd]:
        fail(
            task,
            f"{where}: zero_grad inside the loop: it erases the gradients of the "
            f"earlier micro-batches, so only the last one is used; call it once, "
            f"before the loop (or after the step)",
        )
    if events.index("step") < last_bwd:
        fail(task, f"{where}: optimizer.step() ran before the last backward")


def _diagnose_update(update, expected_update, scale, model, x, y, task, where, k) -> None:
    """Name the bug behind a wrong parameter update (always fails)."""
    if _close(update, k * expected_update, scale):
        fail(
            task,
            f"{where}: loss not divided by the number of micro-batches: the update is "
            f"{k}x the full-batch update (backward adds up {k} mean losses); divide "
            f"each micro-batch loss by {k}",
        )
    micro = _micro_grads(model, x, y, k)
    sizes = [len(c) for c in x.chunk(k)]
    if len(set(sizes)) > 1 and _close(update, _LR * sum(micro) / len(micro), scale):
        fail(
            task,
            f"{where}: the micro-batches hold {sizes} samples, yet each micro-batch's mean "
            f"loss got the same weight 1/{len(micro)}: the samples of the short one count "
            f"more than the others; weight each micro-batch by its share of the batch",
        )
    last = micro[-1]
    if _close(update, _LR * last / k, scale) or _close(update, _LR * last, scale):
        fail(
            task,
            f"{where}: zero_grad inside the loop: only the last micro-batch's "
            f"gradient reached the step; clear gradients once, before the loop",
        )
    err = float((update - expected_update).abs().max())
    fail(
        task,
        f"{where}: parameter update differs from one full-batch step: max abs error "
        f"{err:.3g} > rtol {_RTOL:g} x {scale:.3g} (are all micro-batches used, each "
        f"once, with the loss divided by {k}, and the gradients cleared once per step?)",
    )


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


# ---------------------------------------------------------------------------------- task 5
#: diagnoses offered for the buggy loop of solutions/02_batch_size_and_accumulation.ipynb
UNEVEN_BUG_CHOICES = {
    "a": "zero_grad() belongs inside the loop",
    "b": "the micro-batches differ in size, and dividing each mean loss by their number over-weights the short one",
    "c": "backward() should run once, after the loop",
    "d": "optimizer.step() should run after every micro-batch",
}


def check_uneven_accumulation(bug: str, accumulation_step, task: int = 5) -> None:
    """Task (find the bug): name the bug of a loop that divides every micro-batch mean by the
    number of micro-batches when the last micro-batch is shorter, and fix it; the fixed loop
    must equal one full-batch step (float64, rtol 1e-9) twice in a row."""
    key = bug.strip().lower() if isinstance(bug, str) else None
    if key not in UNEVEN_BUG_CHOICES:
        fail(task, f"bug must be one of {sorted(UNEVEN_BUG_CHOICES)}, got {bug!r}")
    if key != "b":
        fail(
            task,
            f"bug {bug!r} ({UNEVEN_BUG_CHOICES[key]}): the loop is right about that; "
            "compare the micro-batch sizes of a batch of 10 in 3 chunks",
        )
    for seed, batch, k in ((0, 10, 3), (1, 13, 4)):
        _check_one_case(accumulation_step, task, seed, batch, k)
    passed(
        task,
        f"bug named; with micro-batches of 4+4+2 and 4+4+4+1 samples, 2 accumulated steps "
        f"in a row equal 2 full-batch steps (float64, rtol={_RTOL:g})",
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
