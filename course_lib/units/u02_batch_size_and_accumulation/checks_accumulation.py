"""Unit 02's check of task 3: a gradient-accumulation step against the full batch, twice in a
row; the spies, cases and diagnoses are shared with task 5 (:mod:`.checks_uneven`). Re-exported
by :mod:`.checks`."""

from __future__ import annotations

import copy
from typing import Any

from course_lib.grading.core import fail, passed, run_learner
from course_lib.grading.seeds import case_rng
from course_lib.grading.split import split_check

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


def collect_accumulation_step(accumulation_step, task: int = 3) -> list[dict[str, Any]]:
    """Task: one optimizer step over `micro_batches` micro-batches = one full-batch step.

    Each case calls the learner's function twice in a row on the same model and optimizer (two
    steps of a training loop, on two batches), so gradients left over from the first call are
    caught. Compared in float64 with rtol=1e-9: summing micro-batch gradients adds the same
    terms in a different order than the full batch does, so the two differ by rounding only
    (~1e-16 relative in float64); every bug below changes the update by a factor of order 1.
    """
    return [
        _collect_case(accumulation_step, task, seed, batch, k)
        for seed, batch, k in _accumulation_cases(task, uneven=False)
    ]


def judge_accumulation_step(data: Any, task: int = 3) -> None:
    cases = _accumulation_cases(task, uneven=False)
    for (seed, batch, k), runs in zip(cases, _runs(task, data, len(cases))):
        _judge_case(runs, task, seed, batch, k)
    passed(
        task,
        f"2 accumulated steps in a row equal 2 full-batch steps on 2 unseen MLPs "
        f"(float64, rtol={_RTOL:g})",
    )


check_accumulation_step = split_check(collect_accumulation_step, judge_accumulation_step)


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


def _moved_copy(model, flat):
    """The untouched ``model`` copied and moved to the parameters ``flat`` (as :func:`_flat`
    lays them out)."""
    import torch

    reference = copy.deepcopy(model)
    with torch.no_grad():
        offset = 0
        for p in reference.parameters():
            p.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()
    return reference


def _collect_case(accumulation_step, task: int, seed: int, batch: int, k: int) -> dict[str, Any]:
    """Two calls of the learner's step in a row, spied on: the events of each call (forward,
    backward, zero_grad, step, in order), the parameters after each, and the gradients the
    first call left in ``.grad``; all flat, float64."""
    import torch

    model, x, y = _case(seed, batch)
    x2, y2 = _next_batch(x, y, seed)  # the second call's batch
    events: list[str] = []
    work = _spied_copy(model, events)
    opt = _spy_optimizer(work.parameters(), events, _LR)
    loss_fn = _spy_loss(events)
    run_learner(
        task, accumulation_step, work, opt, loss_fn, x, y, k, forbid=_ACCUMULATION_REFERENCES
    )
    first = list(events)
    after_first = _flat(work.parameters())
    left_over = _flat(
        p.grad if p.grad is not None else torch.zeros_like(p) for p in work.parameters()
    )
    # second call, as the next iteration of a training loop: a new batch, same model and optimizer
    events.clear()
    run_learner(
        task, accumulation_step, work, opt, loss_fn, x2, y2, k, forbid=_ACCUMULATION_REFERENCES
    )
    return {
        "events": [first, list(events)],
        "params": [after_first, _flat(work.parameters())],
        "left_over": left_over,
    }


def _runs(task: int, data: Any, n: int) -> list[dict[str, Any]]:
    """``data`` if it is a list of ``n`` cases as :func:`_collect_case` hands them back."""
    if not isinstance(data, list) or len(data) != n or not all(isinstance(d, dict) for d in data):
        fail(task, f"the run handed back no list of {n} cases (got {type(data).__name__})")
    return data


def _run_data(task: int, runs: dict[str, Any], n_params: int) -> tuple[list, list, Any]:
    """The events of the two calls (lists of str), the flat parameters after each and the
    left-over gradients (``n_params`` floating-point values each, as float64), checked."""
    import torch

    events = runs.get("events")
    if not (
        isinstance(events, list)
        and len(events) == 2
        and all(isinstance(e, list) and all(isinstance(i, str) for i in e) for e in events)
    ):
        fail(task, "the run handed back no events of the two calls")
    params = runs.get("params")
    tensors = [*params, runs.get("left_over")] if isinstance(params, list) else []
    if len(tensors) != 3 or not all(
        isinstance(t, torch.Tensor) and t.is_floating_point() and t.shape == (n_params,)
        for t in tensors
    ):
        fail(
            task,
            f"the run handed back no parameters after each call ({n_params} floating-point "
            "values: did the model gain or lose parameters?)",
        )
    flat = [t.to(torch.float64) for t in tensors]
    return events, flat[:2], flat[2]


def _judge_case(runs: dict[str, Any], task: int, seed: int, batch: int, k: int) -> None:
    model, x, y = _case(seed, batch)
    x2, y2 = _next_batch(x, y, seed)  # the second call's batch
    before = _flat(model.parameters())
    (events, events2), (after, after2), left_over = _run_data(task, runs, before.numel())
    # reference: one step on the mean loss over the full batch
    expected_update = _full_batch_update(model, x, y)
    where = f"batch of {batch} in {k} micro-batches"
    _check_events(events, task, where, k)

    update = before - after
    scale = float(expected_update.abs().max())
    if not _close(update, expected_update, scale):
        _diagnose_update(update, expected_update, scale, model, x, y, task, where, k)

    # the second call, from where the first left the parameters
    reference = _moved_copy(model, after)
    expected_update2 = _full_batch_update(reference, x2, y2)
    where2 = f"second call (next batch of {batch} in {k} micro-batches)"
    _check_events(events2, task, where2, k)
    update2 = after - after2
    scale2 = float(expected_update2.abs().max())
    if _close(update2, expected_update2, scale2):
        return
    if "zero_grad" not in events2 and _close(update2, expected_update2 + _LR * left_over, scale2):
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
