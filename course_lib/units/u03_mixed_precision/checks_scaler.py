"""Unit 03's checks of tasks 1-3: the learner's loss scaler on underflow, its schedule, and fp16 training."""

from __future__ import annotations

from course_lib.grading.core import fail, passed, run_learner
from course_lib.grading.seeds import case_rng

UNIT = "u03_mixed_precision"

#: the course's own answer (and PyTorch's), out of reach while the learner's code runs
_REFERENCES = (
    "course_lib.techniques.precision:DynamicLossScaler",
    "course_lib.techniques.precision:make_scaler",
    "torch.amp.grad_scaler:GradScaler",
)


def _learner(task: int, fn, *args, **kwargs):
    """The learner's code, run with the course's own answer out of reach."""
    return run_learner(task, fn, *args, forbid=_REFERENCES, **kwargs)


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
def _underflow_model(task: int):
    """Two linear layers and a batch, sizes drawn from the grading seed."""
    import torch

    rng = case_rng(task, UNIT)
    d_in, hidden, d_out = rng.randint(16, 48), rng.randint(32, 96), rng.randint(4, 12)
    torch.manual_seed(rng.getrandbits(31))
    model = torch.nn.Sequential(torch.nn.Linear(d_in, hidden), torch.nn.Linear(hidden, d_out))
    x = torch.randn(rng.randint(8, 24), d_in)
    return model, x


def _underflow_grads(scaler=None, *, autocast: bool = True, task: int = 1, learner: bool = False):
    """Gradients of a loss weighted by 1e-8 (think: an auxiliary loss term), fp16 autocast."""
    import torch

    model, x = _underflow_model(task)
    with torch.autocast("cpu", dtype=torch.float16, enabled=autocast):
        out = model(x)  # (16, 8): fp16 under autocast
    loss = 1e-8 * out.float().sum()  # dloss/dout = 1e-8: below fp16's smallest subnormal (6e-8)
    if scaler is None:
        loss.backward()
        found_inf = False
    else:
        # the check's own reference scaler is called directly (not watched)
        call = (lambda fn, *a: _learner(task, fn, *a)) if learner else (lambda fn, *a: fn(*a))
        call(scaler.scale, loss).backward()
        found_inf = call(scaler.unscale_, list(model.parameters()))
    return [p.grad.detach().clone() for p in model.parameters()], found_inf


def check_underflow_recovery(LossScaler, task: int = 1) -> None:
    """fp16 gradients that underflow to 0 unscaled must be recovered by scale + unscale_."""
    import torch

    from course_lib.techniques.precision import DynamicLossScaler

    fp32, _ = _underflow_grads(autocast=False, task=task)
    raw, _ = _underflow_grads(task=task)
    ref, _ = _underflow_grads(DynamicLossScaler(init_scale=2.0**16), task=task)
    # the case itself: without scaling every gradient is exactly 0 in fp16
    assert all(bool((g == 0).all()) for g in raw), (
        "grading case broken: unscaled fp16 grads should underflow"
    )
    learner = _make_scaler(task, LossScaler, init_scale=2.0**16)
    got, found_inf = _underflow_grads(learner, task=task, learner=True)
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
#: found_inf flags of the default seed's scripted run: 4 clean steps (growth after 3), an overflow,
#: clean steps, two overflows in a row, clean steps again (:func:`schedule` draws one per seed)
SCHEDULE = (False,) * 4 + (True,) + (False,) * 5 + (True, True) + (False,) * 3


def schedule(task: int = 2) -> tuple[bool, ...]:
    """15 found_inf flags drawn from the grading seed, the same kinds of step as
    :data:`SCHEDULE`: a run of clean steps long enough to grow (3 or more), an overflow, clean
    steps, two overflows in a row, clean steps again."""
    rng = case_rng(task, UNIT)
    first, second = rng.randint(3, 6), rng.randint(1, 6)
    flags = (False,) * first + (True,) + (False,) * second + (True, True)
    return flags + (False,) * (15 - len(flags))


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
    init, interval, flags = 2.0**10, 3, schedule(task)
    expected = _gradscaler_scales(flags, init_scale=init, growth_interval=interval)
    learner = _make_scaler(
        task,
        LossScaler,
        init_scale=init,
        growth_factor=2.0,
        backoff_factor=0.5,
        growth_interval=interval,
    )
    for i, inf in enumerate(flags):
        _learner(task, learner.update, inf)
        got = _learner(task, learner.get_scale)
        if float(got) != expected[i]:
            before = expected[i - 1] if i else init
            what = "an overflow (found_inf=True)" if inf else "a clean step"
            fail(
                task,
                f"step {i} ({what}): the scale was {before:g}, yours is now {float(got):g}, not "
                f"GradScaler's. Flags so far: {list(flags[: i + 1])}, growth_interval={interval}",
            )
    passed(
        task,
        f"scale after each of {len(flags)} steps equals torch.amp.GradScaler's "
        "(growth after 3 clean steps, halving on overflow)",
    )


# ---------------------------------------------------------------------------------- task 3
def _fp16_run(kind: str, LossScaler=None, *, task: int = 3, steps: int = 8):
    import torch

    rng = case_rng(task, UNIT)
    d_in, hidden, d_out = rng.randint(8, 24), rng.randint(16, 48), rng.randint(2, 6)
    torch.manual_seed(rng.getrandbits(31))
    model = torch.nn.Sequential(
        torch.nn.Linear(d_in, hidden), torch.nn.GELU(), torch.nn.Linear(hidden, d_out)
    )
    opt = torch.optim.SGD(model.parameters(), lr=rng.choice((0.02, 0.05, 0.1)))
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
    gen = torch.Generator().manual_seed(rng.getrandbits(63))
    skipped = []
    for _ in range(steps):
        x = torch.randn(8, d_in, generator=gen)
        y = torch.randn(8, d_out, generator=gen)
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

    ref_params, ref_skipped, ref_scale = _fp16_run("reference", task=task)
    params, skipped, scale = _fp16_run("learner", LossScaler, task=task)
    if skipped != ref_skipped:
        fail(
            task,
            f"skipped steps: you skipped {[i for i, s in enumerate(skipped) if s]}, not the "
            "steps GradScaler skips (the run starts at scale 2**20) "
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
        fail(task, f"final scale: {scale:g} is not GradScaler's")
    passed(
        task,
        f"fp16-mixed run matches torch.amp.GradScaler over {len(ref_skipped)} steps: the same "
        "steps skipped (overflows at the start), same weights, same final scale",
    )
