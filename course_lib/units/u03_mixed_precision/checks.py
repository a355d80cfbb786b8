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
"""

from __future__ import annotations

from course_lib.grading.core import fail, passed, run_learner

#: the course's own answer (and PyTorch's), out of reach while the learner's code runs
_REFERENCES = (
    "course_lib.techniques.precision:DynamicLossScaler",
    "course_lib.techniques.precision:make_scaler",
    "torch.amp.grad_scaler:GradScaler",
)


def _learner(task: int, fn, *args, **kwargs):
    """The learner's code, run with the course's own answer out of reach."""
    return run_learner(task, fn, *args, forbid=_REFERENCES, **kwargs)


__all__ = [
    "check_underflow_recovery",
    "check_scale_schedule",
    "check_fp16_training",
    "check_predict_bf16_weight",
    "check_clip_bug",
    "check_state_at_scale",
    "BF16_RUNS",
    "SCALE_MODELS",
    "SCALE_RECIPES",
]


def _make_scaler(task: int, cls, **kwargs):
    scaler = _learner(task, cls, **kwargs)
    for name in ("scale", "unscale_", "update", "get_scale"):
        if not callable(getattr(scaler, name, None)):
            fail(
                task,
                f"expected the scaler to have a method {name}(), got {type(scaler).__name__} without it",
            )
    return scaler


# ---------------------------------------------------------------------------------- task 1
def _underflow_model():
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Linear(64, 8))
    x = torch.randn(16, 32)
    return model, x


def _underflow_grads(scaler=None, *, autocast: bool = True, task: int | None = None):
    """Gradients of a loss weighted by 1e-8 (think: an auxiliary loss term), fp16 autocast."""
    import torch

    model, x = _underflow_model()
    with torch.autocast("cpu", dtype=torch.float16, enabled=autocast):
        out = model(x)  # (16, 8): fp16 under autocast
    loss = 1e-8 * out.float().sum()  # dloss/dout = 1e-8: below fp16's smallest subnormal (6e-8)
    if scaler is None:
        loss.backward()
        found_inf = False
    else:
        # task=None: the check's own reference scaler, called directly (not watched)
        call = (lambda fn, *a: fn(*a)) if task is None else (lambda fn, *a: _learner(task, fn, *a))
        call(scaler.scale, loss).backward()
        found_inf = call(scaler.unscale_, list(model.parameters()))
    return [p.grad.detach().clone() for p in model.parameters()], found_inf


def check_underflow_recovery(LossScaler, task: int = 1) -> None:
    """fp16 gradients that underflow to 0 unscaled must be recovered by scale + unscale_."""
    import torch

    from course_lib.techniques.precision import DynamicLossScaler

    fp32, _ = _underflow_grads(autocast=False)
    raw, _ = _underflow_grads()
    ref, _ = _underflow_grads(DynamicLossScaler(init_scale=2.0**16))
    # the case itself: without scaling every gradient is exactly 0 in fp16
    assert all(bool((g == 0).all()) for g in raw), (
        "grading case broken: unscaled fp16 grads should underflow"
    )
    learner = _make_scaler(task, LossScaler, init_scale=2.0**16)
    got, found_inf = _underflow_grads(learner, task=task)
    if found_inf is not False and found_inf != 0:
        fail(
            task,
            f"unscale_ returned {found_inf!r} on finite gradients; expected False (no inf/NaN)",
        )
    names = ["0.weight", "0.bias", "1.weight", "1.bias"]
    for name, g, r, f in zip(names, got, ref, fp32):
        if g.dtype != torch.float32:
            fail(task, f"grad of {name}: expected float32 (the parameters' dtype), got {g.dtype}")
        zeros = int((g == 0).sum())
        if zeros:
            fail(
                task,
                f"grad of {name}: {zeros} of {g.numel()} values are still 0 after scale + unscale_ "
                "(did scale() multiply the loss by the scale?)",
            )
        ratio = float((g.double() / r.double()).median())
        if not torch.allclose(g, r, rtol=1e-6, atol=0.0):
            hint = f" (they are {ratio:.6g}x the reference: did unscale_ divide by the scale exactly once?)"
            fail(
                task,
                f"grad of {name}: expected the reference unscaled gradient (rtol=1e-06), "
                f"got max abs error {float((g - r).abs().max()):.3g}{hint}",
            )
        rel = float((g - f).norm() / f.norm())  # fp16 math: about 1e-3 of the gradient's size
        if rel > 1e-2:  # pragma: no cover - follows from matching the reference
            fail(
                task, f"grad of {name}: relative error {rel:.3g} (norm) against fp32 is above 1e-2"
            )
    passed(
        task,
        "unscaled fp16 grads underflow to 0; with loss scale 65536 all 4 gradients are "
        "recovered (= reference, within 1% of fp32)",
    )


# ---------------------------------------------------------------------------------- task 2
#: found_inf flags of the scripted run: 4 clean steps (growth after 3), an overflow, clean steps,
#: two overflows in a row, clean steps again
SCHEDULE = (
    False,
    False,
    False,
    False,
    True,
    False,
    False,
    False,
    False,
    False,
    True,
    True,
    False,
    False,
    False,
)


def _gradscaler_scales(flags, *, init_scale: float, growth_interval: int) -> list[float]:
    import torch

    p = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.SGD([p], lr=0.1)
    gs = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=growth_interval)
    scales = []
    for inf in flags:
        gs.scale(p.sum())  # GradScaler needs a scale() call per iteration
        p.grad = torch.full((2,), float("inf") if inf else 1.0)
        gs.step(opt)
        gs.update()
        scales.append(float(gs.get_scale()))
    return scales


def check_scale_schedule(LossScaler, task: int = 2) -> None:
    """update(found_inf) must grow / back off the scale exactly like torch.amp.GradScaler."""
    init, interval = 2.0**10, 3
    expected = _gradscaler_scales(SCHEDULE, init_scale=init, growth_interval=interval)
    learner = _make_scaler(
        task,
        LossScaler,
        init_scale=init,
        growth_factor=2.0,
        backoff_factor=0.5,
        growth_interval=interval,
    )
    for i, inf in enumerate(SCHEDULE):
        _learner(task, learner.update, inf)
        got = _learner(task, learner.get_scale)
        if float(got) != expected[i]:
            before = expected[i - 1] if i else init
            what = "an overflow (found_inf=True)" if inf else "a clean step"
            fail(
                task,
                f"step {i} ({what}): expected scale {expected[i]:g} (it was {before:g}), "
                f"got {float(got):g}. Flags so far: {list(SCHEDULE[: i + 1])}, growth_interval={interval}",
            )
    passed(
        task,
        f"scale after each of {len(SCHEDULE)} steps equals torch.amp.GradScaler's "
        "(growth after 3 clean steps, halving on overflow)",
    )


# ---------------------------------------------------------------------------------- task 3
def _fp16_run(kind: str, LossScaler=None, *, task: int = 3, steps: int = 8):
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    init = 2.0**20  # too large on purpose: the first steps overflow and must be skipped
    if kind == "reference":
        scaler = torch.amp.GradScaler("cpu", init_scale=init, growth_interval=2)
    else:
        scaler = _make_scaler(
            task,
            LossScaler,
            init_scale=init,
            growth_factor=2.0,
            backoff_factor=0.5,
            growth_interval=2,
        )
    gen = torch.Generator().manual_seed(1)
    skipped = []
    for _ in range(steps):
        x = torch.randn(8, 16, generator=gen)
        y = torch.randn(8, 4, generator=gen)
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.float16):
            out = model(x)
        loss = (out.float() - y).pow(2).mean()
        if kind == "reference":
            before = scaler.get_scale()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            skipped.append(scaler.get_scale() < before)
        else:
            _learner(task, scaler.scale, loss).backward()
            found = bool(_learner(task, scaler.unscale_, list(model.parameters())))
            if not found:
                opt.step()
            _learner(task, scaler.update, found)
            skipped.append(found)
    return [p.detach().clone() for p in model.parameters()], skipped, float(scaler.get_scale())


def check_fp16_training(LossScaler, task: int = 3) -> None:
    """8 fp16-mixed SGD steps: same skipped steps, weights and final scale as GradScaler."""
    import torch

    ref_params, ref_skipped, ref_scale = _fp16_run("reference")
    params, skipped, scale = _fp16_run("learner", LossScaler, task=task)
    if skipped != ref_skipped:
        fail(
            task,
            f"skipped steps: expected {[i for i, s in enumerate(ref_skipped) if s]} (overflow at "
            f"scale 2**20), got {[i for i, s in enumerate(skipped) if s]} "
            "(does unscale_ return True when a gradient is inf or NaN?)",
        )
    for i, (p, r) in enumerate(zip(params, ref_params)):
        if not bool(torch.isfinite(p).all()):
            fail(
                task,
                f"parameter {i} contains inf/NaN after training: an overflowing step was not skipped",
            )
        if not torch.allclose(p, r, rtol=1e-6, atol=1e-7):
            fail(
                task,
                f"parameter {i}: expected the GradScaler run's weights (rtol=1e-06, atol=1e-07), "
                f"got max abs error {float((p - r).abs().max()):.3g}",
            )
    if scale != ref_scale:
        fail(task, f"final scale: expected {ref_scale:g}, got {scale:g}")
    passed(
        task,
        f"fp16-mixed run matches torch.amp.GradScaler: {sum(ref_skipped)} of {len(ref_skipped)} "
        f"steps skipped, same weights, final scale {ref_scale:g}",
    )


# ---------------------------------------------------------------------------------- task 4
#: task 4's held-out runs: (starting weight, update added at every step, steps). None of them is the
#: lecture's (1.0, 1e-3, 100); each one is run in bf16 inside the check
BF16_RUNS = (
    (1.0, 0.003, 50),
    (0.75, 0.003, 100),
    (3.0, 0.01, 40),
    (1.0, 0.005, 300),
    (1.0, -0.003, 100),
)
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


def check_predict_bf16_weight(predict_bf16_weight, task: int = 4) -> None:
    """The final bf16 weight of held-out runs, predicted, against the runs themselves (exactly:
    the runs are deterministic, so the tolerance is 0)."""
    import numbers

    for weight, update, steps in BF16_RUNS:
        got = run_learner(task, predict_bf16_weight, weight, update, steps, forbid=_FORBID_4)
        if isinstance(got, bool) or not isinstance(got, numbers.Real):
            fail(
                task,
                f"predict_bf16_weight({weight:g}, {update:g}, {steps}) must return a number, "
                f"got {type(got).__name__} {got!r}",
            )
        measured = _bf16_run(weight, update, steps)
        if float(got) != measured:
            fail(
                task,
                f"weight {weight:g}, update {update:g}, {steps} steps: the bf16 run ends at {measured:.8g} "
                f"(exact arithmetic: {weight + steps * update:.8g}), you predicted {float(got):.8g}. "
                "What is the spacing of bf16 numbers around the weight, and what happens to an "
                "update below half of it? Above half of it?",
            )
    passed(
        task,
        f"{len(BF16_RUNS)} held-out bf16 runs predicted exactly (stalls, rounded-up steps and "
        "binade boundaries)",
    )


# ---------------------------------------------------------------------------------- task 5
#: task 5's run: a static loss scale, the clipping threshold, the learning rate (SGD: the size of
#: the gradient is the size of the step) and the tolerance on the weights (same ops in the same
#: order give equal bits; the tolerance forgives an equivalent order)
CLIP_SCALE, CLIP_NORM, CLIP_LR, CLIP_STEPS, CLIP_RTOL, CLIP_ATOL = 2.0**12, 0.5, 0.1, 6, 1e-5, 1e-7
_FORBID_5 = _REFERENCES + ("course_lib.techniques.precision:train_step",)


def _clip_task():
    import torch

    torch.manual_seed(5)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=CLIP_LR)
    gen = torch.Generator().manual_seed(6)
    batches = [
        (torch.randn(8, 16, generator=gen), 3 * torch.randn(8, 4, generator=gen))
        for _ in range(CLIP_STEPS)
    ]
    return model, opt, batches


def _clip_reference():
    """The loop done right, written out: unscale, then clip, then step."""
    import torch

    model, opt, batches = _clip_task()
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


def check_clip_bug(train, task: int = 5) -> None:
    """The fixed fp16 loop: the same weights as the loop done right (clip the true gradients)."""
    import torch

    ref, norms = _clip_reference()
    model, opt, batches = _clip_task()
    start = [p.detach().clone() for p in model.parameters()]
    run_learner(task, train, model, opt, batches, CLIP_SCALE, CLIP_NORM, forbid=_FORBID_5)
    got = [p.detach() for p in model.parameters()]
    moved = sum(float((g - s).pow(2).sum()) for g, s in zip(got, start)) ** 0.5
    should = sum(float((r - s).pow(2).sum()) for r, s in zip(ref, start)) ** 0.5
    for i, (g, r) in enumerate(zip(got, ref)):
        if not bool(torch.isfinite(g).all()):
            fail(
                task,
                f"parameter {i} has inf/NaN after {CLIP_STEPS} steps: was a step taken on overflowing gradients?",
            )
        if not torch.allclose(g, r, rtol=CLIP_RTOL, atol=CLIP_ATOL):
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
    clipped = sum(n > CLIP_NORM for n in norms)
    passed(
        task,
        f"the fixed loop matches the loop done right: {CLIP_STEPS} fp16 steps at loss scale "
        f"{CLIP_SCALE:g}, true gradient norm clipped to {CLIP_NORM:g} in {clipped} of them",
    )


# ---------------------------------------------------------------------------------- task 6
#: task 6's models (Llama-2-7B and -70B parameter counts, Touvron et al. 2023) and recipes, with
#: the row of ``estimate.model_state_bytes`` each one stores (autocast keeps the fp32 row)
SCALE_MODELS = {"7B": 6_738_415_616, "70B": 68_976_648_192}
SCALE_RECIPES = {
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


def check_state_at_scale(adam_state_bytes, task: int = 6) -> None:
    """Adam model state (params, grads, master, moments; no step counters) of 7B and 70B models in
    each recipe, against ``estimate.model_state_bytes``."""
    from course_lib.grading.core import expect_int
    from course_lib.measure import estimate

    for name, n in SCALE_MODELS.items():
        for recipe, row in SCALE_RECIPES.items():
            got = expect_int(
                task,
                f"adam_state_bytes({n:,}, {recipe!r})",
                run_learner(task, adam_state_bytes, n, recipe, forbid=_FORBID_6),
            )
            expected = estimate.model_state_bytes(n, precision=row, optimizer="adam")["total"]
            if got != expected:
                fail(
                    task,
                    f"{name} ({n:,} parameters), recipe {recipe!r}: expected {expected:,} B "
                    f"({expected // n} B/param), got {got:,} B ({got / n:.3g} B/param). "
                    "Which tensors does this recipe keep, and in which dtype?",
                )
    b7 = {
        r: estimate.model_state_bytes(SCALE_MODELS["7B"], precision=row)["total"]
        for r, row in SCALE_RECIPES.items()
    }
    passed(
        task,
        f"{len(SCALE_MODELS) * len(SCALE_RECIPES)} answers equal estimate's model state (7B: "
        f"{b7['fp32'] / 1e9:.1f} GB in fp32, paper and autocast mixed; {b7['bf16-true'] / 1e9:.1f} GB bf16-true)",
    )
