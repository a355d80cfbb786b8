"""Checks for the exercises of unit 01 (solutions/01_backprop_memory.ipynb).

Both checks build random MLPs the learner has not seen, run a real training step under
MemoryMeter, and compare the learner's prediction with what was measured.

Task 1: optimizer_state_bytes(model, optimizer) -> bytes of optimizer state after one step.
Task 2: predict_step_memory(model, batch_shape, optimizer) -> bytes per category.
"""
from __future__ import annotations

from course_lib.grading.core import expect_int, fail, fmt_int, passed, run_learner

_CATEGORIES = ("params", "grads", "optimizer", "activations")


def _unseen_cases():
    """Random MLPs (seeded, so the verdict is deterministic): widths, depth, activation, bias."""
    import random

    import torch

    from course_lib.models import MLP, MLPConfig

    rng = random.Random(20260101)
    activations = ["relu", "gelu", "tanh", "silu"]
    optimizers = ["adam", "momentum", "sgd", "adam"]
    cases = []
    for i in range(4):
        depth = rng.randint(1, 3)
        cfg = MLPConfig(in_features=rng.randint(3, 40),
                        hidden=tuple(rng.randint(4, 96) for _ in range(depth)),
                        out_features=rng.randint(2, 12), activation=activations[i],
                        bias=(i != 2))
        torch.manual_seed(i)
        cases.append((MLP(cfg), (rng.randint(2, 48),), optimizers[i]))
    return cases


def _measure(model, batch_shape, optimizer) -> dict:
    """One real training step of a copy of `model` under MemoryMeter, per category: params,
    grads and optimizer at their largest over the step; activations when the forward ends."""
    import copy

    import torch
    import torch.nn.functional as F

    from course_lib.measure.memory import MemoryMeter

    work = copy.deepcopy(model)
    opt = {"sgd": lambda p: torch.optim.SGD(p, lr=1e-3, foreach=False),
           "momentum": lambda p: torch.optim.SGD(p, lr=1e-3, momentum=0.9, foreach=False),
           "adam": lambda p: torch.optim.Adam(p, lr=1e-3, foreach=False)}[optimizer](
        work.parameters())
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch_shape[0], work.config.in_features, generator=g)
    y = torch.randint(0, work.config.out_features, tuple(batch_shape), generator=g)
    with MemoryMeter(work, opt) as meter:
        F.cross_entropy(work(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    tl = meter.timeline
    out = {c: int(tl[c].max()) for c in ("params", "grads", "optimizer")}
    out["activations"] = int(tl[tl["event"] == "post_forward"].iloc[-1]["activations"])
    return out


#: the course's own answers (and the meter the check measures with), out of reach while the
#: learner's function runs: the task is to predict, from the model, what the meter will say
_REFERENCES = ("course_lib.measure.estimate.memory:model_state_bytes", "course_lib.measure.estimate.memory:optimizer_state_bytes_per_param",
               "course_lib.measure.estimate.memory:activation_bytes_mlp", "course_lib.measure.estimate.memory:activation_bytes_gpt",
               "course_lib.techniques.optim:state_bytes", "course_lib.measure.memory:MemoryMeter")


def _describe(model, batch_shape, optimizer) -> str:
    c = model.config
    return (f"MLP widths={c.widths} activation={c.activation} bias={c.bias}, "
            f"batch_shape={tuple(batch_shape)}, optimizer={optimizer!r}")


def check_optimizer_state_bytes(optimizer_state_bytes, task: int = 1) -> None:
    """Task: bytes of optimizer state torch.optim keeps after one step (exact)."""
    total = 0
    for model, batch_shape, opt in _unseen_cases():
        expected = _measure(model, batch_shape, opt)["optimizer"]
        got = run_learner(task, optimizer_state_bytes, model, opt, forbid=_REFERENCES)
        expect_int(task, f"the optimizer-state bytes ({opt})", got)
        if got != expected:
            hint = ""
            n_tensors = len(list(model.parameters()))
            if isinstance(got, int) and expected - got == 4 * n_tensors and opt == "adam":
                hint = (f" (Adam also keeps a 4-byte 'step' counter per parameter tensor: "
                        f"{n_tensors} tensors)")
            fail(task, f"{_describe(model, batch_shape, opt)}: expected {fmt_int(expected)} B "
                       f"(measured), got {got!r}{hint}")
        total += expected
    passed(task, f"optimizer state matches MemoryMeter on 4 unseen MLPs ({fmt_int(total)} B in all)")


def check_predict_step_memory(predict_step_memory, task: int = 2) -> None:
    """Task: predicted bytes per category = what MemoryMeter measures, on unseen MLPs (exact)."""
    for model, batch_shape, opt in _unseen_cases():
        measured = _measure(model, batch_shape, opt)
        got = run_learner(task, predict_step_memory, model, batch_shape, opt,
                          forbid=_REFERENCES)
        if not isinstance(got, dict):
            fail(task, f"expected a dict with keys {list(_CATEGORIES)}, got {type(got).__name__}")
        missing = [c for c in _CATEGORIES if c not in got]
        if missing:
            fail(task, f"expected a dict with keys {list(_CATEGORIES)}, missing {missing}")
        for c in _CATEGORIES:
            expect_int(task, f"{c} (bytes)", got[c])
            if got[c] != measured[c]:
                hint = _hint(c, model, batch_shape, opt, got[c], measured[c])
                fail(task, f"{_describe(model, batch_shape, opt)}: {c}: expected "
                           f"{fmt_int(measured[c])} B (measured), got {got[c]!r}{hint}")
    passed(task, "params, grads, optimizer and activations match MemoryMeter exactly on 4 unseen "
                 "MLPs")


def _hint(category, model, batch_shape, opt, got, expected) -> str:
    if not isinstance(got, int):
        return " (bytes are ints)"
    if category == "activations":
        from course_lib.measure import estimate

        batch, widths = batch_shape[0], model.config.widths
        other_rule = {estimate.activation_bytes_mlp(batch, widths, activation=a)
                      for a in ("relu", "gelu")} - {expected}
        if got in other_rule:
            return " (check what the activation saves: relu/tanh keep u, gelu/silu keep z too)"
        if got - expected == 4 * batch * model.config.in_features:
            return " (the input x is created before the step: it is not an activation here)"
        return " (use estimate.activation_bytes_mlp with the model's widths and activation)"
    if category == "optimizer":
        return " (use estimate.model_state_bytes; Adam keeps a step counter per parameter tensor)"
    return ""
