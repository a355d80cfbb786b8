"""Checks for the exercises of unit 03 (solutions/03_mixed_precision.ipynb).

The learner writes a dynamic loss scaler: a class built as
``LossScaler(init_scale=..., growth_factor=..., backoff_factor=..., growth_interval=...)`` with
``scale(loss)``, ``unscale_(params) -> found_inf`` and ``update(found_inf)``, plus ``get_scale()``.

Task 1: a case where fp16 gradients underflow to zero without scaling; the learner's
``scale``/``unscale_`` must recover them (same values as the reference scaler, and close to fp32).
Task 2: growth and backoff: a scripted run of clean and overflowing steps must give the same scale
after every step as ``torch.amp.GradScaler``.
Task 3: a short fp16-mixed training run with the learner's scaler must skip the same steps and end
with the same weights and scale as the same run with ``torch.amp.GradScaler``.
Task 4 (predict before you measure): the final value of a bf16 weight that receives a small update
at every step, for held-out configurations, against the bf16 run itself (exact: it is deterministic).
Task 5 (find the bug): an fp16 loop that clips the gradient norm before unscaling; the fixed loop
must end with the weights of the loop done right (rtol=1e-5, atol=1e-7).
Task 6 (scale it up): Adam model state of Llama-2-7B and -70B in four recipes, against
``estimate.model_state_bytes``.

Every task draws its cases from the grading seed (:func:`course_lib.grading.seeds.case_rng`):
model sizes and data (1, 3, 5), the overflow schedule (2), the bf16 runs (4), one more model size
(6); the edge cases of the fixed tables stay, with drawn numbers.

Each check is split (:mod:`course_lib.grading.split`): ``collect_X`` runs the learner's code on the
drawn cases and hands back what it produced; ``judge_X`` computes the expected values with the
course's references and prints the verdict.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from course_lib.grading.core import fail, passed, run_learner
from course_lib.grading.seeds import case_rng
from course_lib.grading.split import split_check
from course_lib.units.u03_mixed_precision.checks_scaler import (  # noqa: F401 (re-exported)
    _REFERENCES,
    SCHEDULE,
    UNIT,
    _drawn_mlp_task,
    _same_shape,
    _tensor_list,
    check_fp16_training,
    check_scale_schedule,
    check_underflow_recovery,
)

if TYPE_CHECKING:
    from course_lib.measure.estimate import Precision


# ---------------------------------------------------------------------------------- task 4
#: task 4's runs of the default seed: (starting weight, update added at every step, steps). None
#: of them is the lecture's (1.0, 1e-3, 100); each one is run in bf16 inside the check
BF16_RUNS = (
    (1.0, 0.003, 50),
    (0.75, 0.003, 100),
    (3.0, 0.01, 40),
    (1.0, 0.005, 300),
    (1.0, -0.003, 100),
)


def bf16_runs(task: int = 4) -> tuple[tuple[float, float, int], ...]:
    """Five runs drawn from the grading seed, one of each kind: a stall (the update below half
    the spacing), rounded-up steps (above half of it), a climb that stops at a binade boundary
    (the spacing doubles there), a descent from a power of two (the spacing halves below it),
    and a stall with a negative update. Updates stay away from half a spacing (no ties)."""
    rng = case_rng(task, UNIT)

    def binade():
        e = rng.randint(-3, 2)
        return 2.0**e, 2.0 ** (e - 7)  # its first number and the spacing of bf16 there

    def frac(low, high):
        return rng.randint(round(low * 1000), round(high * 1000)) / 1000

    runs = []
    base, s = binade()
    runs.append((base + rng.randint(0, 127) * s, frac(0.15, 0.42) * s, rng.randint(20, 300)))
    base, s = binade()
    j = rng.randint(0, 40)
    runs.append((base + j * s, frac(0.58, 0.9) * s, rng.randint(10, 60)))
    base, s = binade()
    k = rng.randint(5, 30)
    runs.append((2 * base - k * s, frac(0.58, 0.9) * s, k + rng.randint(10, 80)))
    base, s = binade()
    runs.append((base, -frac(0.3, 0.42) * s, rng.randint(20, 100)))
    base, s = binade()
    runs.append((base + rng.randint(1, 127) * s, -frac(0.1, 0.4) * s, rng.randint(20, 200)))
    rng.shuffle(runs)
    return tuple(runs)


_FORBID_4 = (
    "course_lib.units.u03_mixed_precision.run:tiny_updates",
    "course_lib.techniques.precision:round_trip",
)


def _bf16_run(weight: float, update: float, steps: int) -> float:
    """A bf16 weight that receives ``update`` ``steps`` times: the sum in fp32, rounded to bf16."""
    import torch

    w = torch.tensor(weight, dtype=torch.bfloat16)
    for _ in range(steps):
        w = (w.float() + update).to(torch.bfloat16)
    return float(w)


def collect_predict_bf16_weight(predict_bf16_weight, task: int = 4) -> list[Any]:
    """The final bf16 weight of held-out runs, predicted, against the runs themselves (exactly:
    the runs are deterministic, so the tolerance is 0)."""
    import numbers

    out = []
    for weight, update, steps in bf16_runs(task):
        got = run_learner(task, predict_bf16_weight, weight, update, steps, forbid=_FORBID_4)
        # any real number, as float (plain data carries Python numbers, not numpy's)
        real = isinstance(got, numbers.Real) and not isinstance(got, bool)
        out.append(float(got) if real else got)
    return out


def judge_predict_bf16_weight(data: Any, task: int = 4) -> None:
    from course_lib.grading.plain import describe

    runs = bf16_runs(task)
    got_all = data if isinstance(data, list) and len(data) == len(runs) else [None] * len(runs)
    for (weight, update, steps), got in zip(runs, got_all):
        if not isinstance(got, float):
            fail(
                task,
                f"predict_bf16_weight({weight:g}, {update:g}, {steps}) must return a number, "
                f"got {describe(got)}",
            )
        measured = _bf16_run(weight, update, steps)
        if got != measured:
            fail(
                task,
                f"weight {weight:g}, update {update:g}, {steps} steps: you predicted "
                f"{got:.8g}, not where the bf16 run ends (exact arithmetic would give "
                f"{weight + steps * update:.8g}). "
                "What is the spacing of bf16 numbers around the weight, and what happens to an "
                "update below half of it? Above half of it?",
            )
    passed(
        task,
        f"{len(runs)} held-out bf16 runs predicted exactly (stalls, rounded-up steps and "
        "binade boundaries)",
    )


check_predict_bf16_weight = split_check(collect_predict_bf16_weight, judge_predict_bf16_weight)


# ---------------------------------------------------------------------------------- task 5
#: task 5's run: a static loss scale, the clipping threshold, the learning rate (SGD: the size of
#: the gradient is the size of the step) and the tolerance on the weights (same ops in the same
#: order give equal bits; the tolerance forgives an equivalent order)
CLIP_SCALE, CLIP_NORM, CLIP_LR, CLIP_STEPS, CLIP_RTOL, CLIP_ATOL = 2.0**12, 0.5, 0.1, 6, 1e-5, 1e-7
_FORBID_5 = _REFERENCES + ("course_lib.techniques.precision:train_step",)


def _clip_task(task: int):
    """The model, optimizer and batches of task 5, sizes and data drawn from the grading seed."""
    return _drawn_mlp_task(task, CLIP_STEPS, lr=CLIP_LR, target_scale=3.0)


def _clip_reference(task: int):
    """The loop done right, written out: unscale, then clip, then step."""
    import torch

    model, opt, batches = _clip_task(task)
    norms = []
    for x, y in batches:
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.float16):
            out = model(x)
        loss = (out.float() - y).pow(2).mean()
        (loss * CLIP_SCALE).backward()
        for p in model.parameters():
            p.grad.div_(CLIP_SCALE)
        if all(bool(torch.isfinite(p.grad).all()) for p in model.parameters()):
            norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP_NORM)))
            opt.step()
    return [p.detach().clone() for p in model.parameters()], norms


def collect_clip_bug(train, task: int = 5) -> list[Any]:
    """The fixed fp16 loop: the same weights as the loop done right (clip the true gradients)."""
    model, opt, batches = _clip_task(task)
    run_learner(task, train, model, opt, batches, CLIP_SCALE, CLIP_NORM, forbid=_FORBID_5)
    return [p.detach().clone() for p in model.parameters()]


def judge_clip_bug(data: Any, task: int = 5) -> None:
    import torch

    ref, norms = _clip_reference(task)
    start = [p.detach().clone() for p in _clip_task(task)[0].parameters()]
    got = _tensor_list(task, {"params": data}, "params", len(ref), "parameters")
    for i, (g, r) in enumerate(zip(got, ref)):
        _same_shape(task, f"parameter {i}", g, r)
    moved = sum(float((g - s).pow(2).sum()) for g, s in zip(got, start)) ** 0.5
    should = sum(float((r - s).pow(2).sum()) for r, s in zip(ref, start)) ** 0.5
    for i, (g, r) in enumerate(zip(got, ref)):
        if not bool(torch.isfinite(g).all()):
            fail(
                task,
                f"parameter {i} has inf/NaN after {CLIP_STEPS} steps: was a step taken on overflowing gradients?",
            )
        if not torch.allclose(g, r.to(g.dtype), rtol=CLIP_RTOL, atol=CLIP_ATOL):
            hint = ""
            if moved > 0 and should / moved > 100:
                hint = (
                    f" Your weights moved {should / moved:.3g}x less than they should: what size were the "
                    "gradients when they were clipped?"
                )
            fail(
                task,
                f"parameter {i}: differs from the loop done right after {CLIP_STEPS} SGD steps, max abs "
                f"error {float((g - r).abs().max()):.3g} (rtol={CLIP_RTOL:g}, atol={CLIP_ATOL:g}).{hint}",
            )
    passed(
        task,
        f"the fixed loop matches the loop done right: {CLIP_STEPS} fp16 steps at loss scale "
        f"{CLIP_SCALE:g}, the true gradient norm clipped to {CLIP_NORM:g}",
    )


check_clip_bug = split_check(collect_clip_bug, judge_clip_bug)


# ---------------------------------------------------------------------------------- task 6
#: task 6's models (Llama-2-7B and -70B parameter counts, Touvron et al. 2023) and recipes, with
#: the row of ``estimate.model_state_bytes`` each one stores (autocast keeps the fp32 row)
SCALE_MODELS = {"7B": 6_738_415_616, "70B": 68_976_648_192}
SCALE_RECIPES: dict[str, Precision] = {
    "fp32": "fp32",
    "paper bf16-mixed": "bf16-mixed",
    "autocast bf16-mixed": "fp32",
    "bf16-true": "bf16-true",
}
_FORBID_6 = (
    "course_lib.measure.estimate.memory:model_state_bytes",
    "course_lib.measure.estimate.memory:optimizer_state_bytes_per_param",
    "course_lib.measure.estimate.zero:zero_bytes_per_rank",
    "course_lib.measure.estimate.zero:zero_state_breakdown_per_rank",
)


def _scale_cases(task: int) -> list[tuple[str, int, str]]:
    """(model, parameters, recipe) of task 6: Llama-2-7B, -70B and a size drawn from the seed."""
    drawn = case_rng(task, UNIT).randint(10**9, 4 * 10**11)
    models = {**SCALE_MODELS, "drawn": drawn}
    return [(name, n, recipe) for name, n in models.items() for recipe in SCALE_RECIPES]


def collect_state_at_scale(adam_state_bytes, task: int = 6) -> list[Any]:
    """Adam model state (params, grads, master, moments; no step counters) of 7B and 70B models in
    each recipe, against ``estimate.model_state_bytes``."""
    return [
        run_learner(task, adam_state_bytes, n, recipe, forbid=_FORBID_6)
        for _, n, recipe in _scale_cases(task)
    ]


def judge_state_at_scale(data: Any, task: int = 6) -> None:
    from course_lib.grading.core import expect_int
    from course_lib.measure import estimate

    cases = _scale_cases(task)
    got_all = data if isinstance(data, list) and len(data) == len(cases) else [None] * len(cases)
    for (name, n, recipe), answer in zip(cases, got_all):
        got = expect_int(task, f"adam_state_bytes({n:,}, {recipe!r})", answer)
        row = SCALE_RECIPES[recipe]
        expected = estimate.model_state_bytes(n, precision=row, optimizer="adam")["total"]
        if got != expected:
            fail(
                task,
                f"{name} ({n:,} parameters), recipe {recipe!r}: {got:,} B ({got / n:.3g} "
                "B/param) is not this recipe's model state. "
                "Which tensors does this recipe keep, and in which dtype?",
            )
    b7 = {
        r: estimate.model_state_bytes(SCALE_MODELS["7B"], precision=row)["total"]
        for r, row in SCALE_RECIPES.items()
    }
    passed(
        task,
        f"{len(cases)} answers equal estimate's model state (7B: "
        f"{b7['fp32'] / 1e9:.1f} GB in fp32, paper and autocast mixed; {b7['bf16-true'] / 1e9:.1f} GB bf16-true)",
    )


check_state_at_scale = split_check(collect_state_at_scale, judge_state_at_scale)
