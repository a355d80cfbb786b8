"""Unit 02's checks of tasks 3 and 5: a gradient-accumulation step, even and uneven, against the full batch."""

from __future__ import annotations

import copy
from typing import Any

from course_lib.grading.core import fail, passed, run_learner
from course_lib.grading.seeds import case_rng

_ACCUMULATION_REFERENCES = (
    "course_lib.techniques.accumulation:accumulation_step",
    "course_lib.techniques.accumulation:effective_batch",
)


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


def _accumulation_cases(task: int, *, uneven: bool) -> list[tuple[int, int, int]]:
    """(seed, batch, micro_batches) of two cases drawn from the grading seed: even (the batch a
    multiple of the micro-batch count) or uneven (a shorter last micro-batch; torch.chunk still
    gives ``micro_batches`` chunks)."""
    rng = case_rng(task, "u02_batch_size_and_accumulation")
    cases: list[tuple[int, int, int]] = []
    while len(cases) < 2:
        k = rng.randint(2, 5)
        size = rng.randint(2, 6)
        batch = k * size - (rng.randint(1, size - 1) if uneven else 0)
        chunk = -(-batch // k)  # torch.chunk's size: ceil(batch / k), the last one shorter
        if -(-batch // chunk) == k and (batch % chunk != 0) == uneven:
            cases.append((rng.getrandbits(31), batch, k))
    return cases


def _case(seed: int, batch: int):
    import random

    import torch
    from torch import nn

    torch.manual_seed(seed)
    draw = random.Random(seed)
    d_in, hidden, classes = draw.randint(4, 12), draw.randint(12, 40), draw.randint(3, 8)
    model = nn.Sequential(nn.Linear(d_in, hidden), nn.Tanh(), nn.Linear(hidden, classes))
    model = model.double()  # float64: the check's tolerance is then far below any bug's effect
    x = torch.randn(batch, d_in, dtype=torch.float64)
    y = torch.randint(0, classes, (batch,))
    return model, x, y


def _flat(params) -> Any:  # a flat torch.Tensor (torch is imported inside)
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
    for seed, batch, k in _accumulation_cases(task, uneven=False):
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


def _next_batch(x, y, seed: int):
    """A new batch shaped like (x, y), as the next iteration of a training loop would see."""
    import torch

    g = torch.Generator().manual_seed(100 + seed)
    x2 = torch.randn(x.shape, dtype=x.dtype, generator=g)
    y2 = torch.randint(0, int(y.max()) + 1, y.shape, generator=g)
    return x2, y2


def _spied_copy(model, events: list[str]):
    """A copy of ``model`` whose ``zero_grad()`` is logged in ``events`` (it counts as
    zero_grad too)."""
    work = copy.deepcopy(model)
    model_zero_grad = work.zero_grad

    def logged_model_zero_grad(set_to_none: bool = True):
        events.append("zero_grad")
        return model_zero_grad(set_to_none=set_to_none)

    work.zero_grad = logged_model_zero_grad
    return work


def _moved_copy(model, work):
    """The untouched ``model`` copied and moved to ``work``'s current parameters."""
    import torch

    reference = copy.deepcopy(model)
    with torch.no_grad():
        for p, q in zip(reference.parameters(), work.parameters()):
            p.copy_(q)
    return reference


def _check_one_case(accumulation_step, task: int, seed: int, batch: int, k: int) -> None:
    import torch

    model, x, y = _case(seed, batch)
    x2, y2 = _next_batch(x, y, seed)  # the second call's batch
    before = _flat(model.parameters())
    # reference: one step on the mean loss over the full batch
    expected_update = _full_batch_update(model, x, y)

    events: list[str] = []
    work = _spied_copy(model, events)
    opt = _spy_optimizer(work.parameters(), events, _LR)
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
    reference = _moved_copy(model, work)
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
    for seed, batch, k in _accumulation_cases(task, uneven=True):
        _check_one_case(accumulation_step, task, seed, batch, k)
    passed(
        task,
        f"bug named; with a shorter last micro-batch in 2 unseen cases, 2 accumulated steps "
        f"in a row equal 2 full-batch steps (float64, rtol={_RTOL:g})",
    )
