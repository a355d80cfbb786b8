"""Unit 03's checks of tasks 1-3: the learner's loss scaler on underflow, its schedule, and fp16 training.

Each check is split (:mod:`course_lib.grading.split`): ``collect_X`` drives the learner's scaler and
hands back what it produced (gradients, scales, weights); ``judge_X`` runs the references
(``DynamicLossScaler``, ``torch.amp.GradScaler``) and compares."""

from __future__ import annotations

from typing import Any

from course_lib.grading.core import fail, passed, run_learner
from course_lib.grading.seeds import case_rng
from course_lib.grading.split import need, split_check

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


def _tensor_list(task: int, data: Any, key: str, n: int, what: str) -> list:
    """``data[key]``: ``n`` tensors, or the ✗ verdict (the judge trusts nothing it is given)."""
    import torch

    from course_lib.grading.plain import describe

    got = need(task, data, key, list, what)
    if len(got) != n:
        fail(task, f"the run handed back {len(got)} {what}, expected {n}")
    for i, t in enumerate(got):
        if not isinstance(t, torch.Tensor):
            fail(task, f"{what} {i}: expected a tensor, got {describe(t)}")
    return got


def _same_shape(task: int, what: str, got, expected) -> None:
    if tuple(got.shape) != tuple(expected.shape) or not got.dtype.is_floating_point:
        fail(
            task,
            f"{what}: expected a float tensor of shape {tuple(expected.shape)}, got "
            f"{got.dtype} of shape {tuple(got.shape)}",
        )


# ---------------------------------------------------------------------------------- task 1
def _is_false(value: Any) -> bool:
    """False, 0 or a one-element tensor holding 0: "no inf/NaN" as unscale_ may say it."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.numel() == 1 and not bool(value.reshape(()).item())
    return value is False or (
        not isinstance(value, bool) and isinstance(value, (int, float)) and value == 0
    )


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
    grads = [None if p.grad is None else p.grad.detach().clone() for p in model.parameters()]
    return grads, found_inf


def collect_underflow_recovery(LossScaler, task: int = 1) -> dict[str, Any]:
    """fp16 gradients that underflow to 0 unscaled must be recovered by scale + unscale_."""
    learner = _make_scaler(task, LossScaler, init_scale=2.0**16)
    grads, found_inf = _underflow_grads(learner, task=task, learner=True)
    return {"grads": grads, "found_inf": found_inf}


def judge_underflow_recovery(data: Any, task: int = 1) -> None:
    import torch

    from course_lib.techniques.precision import DynamicLossScaler

    fp32, _ = _underflow_grads(autocast=False, task=task)
    raw, _ = _underflow_grads(task=task)
    ref, _ = _underflow_grads(DynamicLossScaler(init_scale=2.0**16), task=task)
    # the case itself: without scaling every gradient is exactly 0 in fp16
    assert all(bool((g == 0).all()) for g in raw), (
        "grading case broken: unscaled fp16 grads should underflow"
    )
    found_inf = data.get("found_inf") if isinstance(data, dict) else None
    if not _is_false(found_inf):
        fail(
            task,
            f"unscale_ returned {found_inf!r} on finite gradients; expected False (no inf/NaN)",
        )
    names = ["0.weight", "0.bias", "1.weight", "1.bias"]
    got = _tensor_list(task, data, "grads", len(names), "gradients")
    for name, g, r, f in zip(names, got, ref, fp32):
        if g.dtype != torch.float32:
            fail(task, f"grad of {name}: expected float32 (the parameters' dtype), got {g.dtype}")
        _same_shape(task, f"grad of {name}", g, r)
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


check_underflow_recovery = split_check(collect_underflow_recovery, judge_underflow_recovery)


# ---------------------------------------------------------------------------------- task 2
#: found_inf flags of the default seed's scripted run: 4 clean steps (growth after 3), an overflow,
#: clean steps, two overflows in a row, clean steps again (:func:`schedule` draws one per seed)
SCHEDULE = (False,) * 4 + (True,) + (False,) * 5 + (True, True) + (False,) * 3
_INIT, _INTERVAL = 2.0**10, 3


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


def collect_scale_schedule(LossScaler, task: int = 2) -> list[Any]:
    """update(found_inf) must grow / back off the scale exactly like torch.amp.GradScaler."""
    learner = _make_scaler(
        task,
        LossScaler,
        init_scale=_INIT,
        growth_factor=2.0,
        backoff_factor=0.5,
        growth_interval=_INTERVAL,
    )
    scales = []
    for inf in schedule(task):
        _learner(task, learner.update, inf)
        scales.append(_learner(task, float, _learner(task, learner.get_scale)))
    return scales


def judge_scale_schedule(data: Any, task: int = 2) -> None:
    from course_lib.grading.plain import describe

    init, interval, flags = _INIT, _INTERVAL, schedule(task)
    expected = _gradscaler_scales(flags, init_scale=init, growth_interval=interval)
    if not isinstance(data, list) or len(data) != len(flags):
        fail(task, f"the run handed back no scale after each of the {len(flags)} steps")
    for i, (inf, got) in enumerate(zip(flags, data)):
        if isinstance(got, bool) or not isinstance(got, (int, float)):
            fail(task, f"step {i}: get_scale() must return a number, got {describe(got)}")
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


check_scale_schedule = split_check(collect_scale_schedule, judge_scale_schedule)


# ---------------------------------------------------------------------------------- task 3
_FP16_STEPS, _FP16_INIT = 8, 2.0**20  # the initial scale is too large on purpose: the first
# steps overflow and must be skipped


def _drawn_mlp_task(task: int, steps: int, *, lr: float | None = None, target_scale: float = 1.0):
    """A GELU MLP, its SGD and ``steps`` batches of 8, sizes and data drawn from the grading
    seed (the learning rate too, unless ``lr`` is given); targets times ``target_scale``."""
    import torch

    rng = case_rng(task, UNIT)
    d_in, hidden, d_out = rng.randint(8, 24), rng.randint(16, 48), rng.randint(2, 6)
    torch.manual_seed(rng.getrandbits(31))
    model = torch.nn.Sequential(
        torch.nn.Linear(d_in, hidden), torch.nn.GELU(), torch.nn.Linear(hidden, d_out)
    )
    opt = torch.optim.SGD(
        model.parameters(), lr=lr if lr is not None else rng.choice((0.02, 0.05, 0.1))
    )
    gen = torch.Generator().manual_seed(rng.getrandbits(63))
    batches = [
        (torch.randn(8, d_in, generator=gen), target_scale * torch.randn(8, d_out, generator=gen))
        for _ in range(steps)
    ]
    return model, opt, batches


def _fp16_setup(task: int):
    """The model, optimizer and batches of task 3."""
    return _drawn_mlp_task(task, _FP16_STEPS)


def _fp16_loss(model, x, y):
    import torch

    with torch.autocast("cpu", dtype=torch.float16):
        out = model(x)
    return (out.float() - y).pow(2).mean()


def _fp16_reference(task: int):
    """The run with torch.amp.GradScaler: weights, skipped steps, final scale."""
    import torch

    model, opt, batches = _fp16_setup(task)
    scaler = torch.amp.GradScaler("cpu", init_scale=_FP16_INIT, growth_interval=2)
    skipped = []
    for x, y in batches:
        opt.zero_grad(set_to_none=True)
        loss = _fp16_loss(model, x, y)
        before = scaler.get_scale()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        skipped.append(scaler.get_scale() < before)
    return [p.detach().clone() for p in model.parameters()], skipped, float(scaler.get_scale())


def collect_fp16_training(LossScaler, task: int = 3) -> dict[str, Any]:
    """8 fp16-mixed SGD steps: same skipped steps, weights and final scale as GradScaler."""
    model, opt, batches = _fp16_setup(task)
    scaler = _make_scaler(
        task,
        LossScaler,
        init_scale=_FP16_INIT,
        growth_factor=2.0,
        backoff_factor=0.5,
        growth_interval=2,
    )
    skipped = []
    for x, y in batches:
        opt.zero_grad(set_to_none=True)
        loss = _fp16_loss(model, x, y)
        _learner(task, scaler.scale, loss).backward()
        found = bool(_learner(task, scaler.unscale_, list(model.parameters())))
        if not found:
            opt.step()
        _learner(task, scaler.update, found)
        skipped.append(found)
    return {
        "params": [p.detach().clone() for p in model.parameters()],
        "skipped": skipped,
        "scale": _learner(task, float, _learner(task, scaler.get_scale)),
    }


def judge_fp16_training(data: Any, task: int = 3) -> None:
    import torch

    ref_params, ref_skipped, ref_scale = _fp16_reference(task)
    skipped = need(task, data, "skipped", list, "skipped steps")
    if not all(isinstance(s, bool) for s in skipped):
        fail(task, f"skipped steps: expected one bool per step, got {skipped!r}"[:300])
    if skipped != ref_skipped:
        fail(
            task,
            f"skipped steps: you skipped {[i for i, s in enumerate(skipped) if s]}, not the "
            "steps GradScaler skips (the run starts at scale 2**20) "
            "(does unscale_ return True when a gradient is inf or NaN?)",
        )
    params = _tensor_list(task, data, "params", len(ref_params), "parameters")
    for i, (p, r) in enumerate(zip(params, ref_params)):
        _same_shape(task, f"parameter {i}", p, r)
        if not bool(torch.isfinite(p).all()):
            fail(
                task,
                f"parameter {i} contains inf/NaN after training: an overflowing step was not skipped",
            )
        if not torch.allclose(p, r.to(p.dtype), rtol=1e-6, atol=1e-7):
            fail(
                task,
                f"parameter {i}: expected the GradScaler run's weights (rtol=1e-06, atol=1e-07), "
                f"got max abs error {float((p - r).abs().max()):.3g}",
            )
    scale = need(task, data, "scale", float, "final scale")
    if scale != ref_scale:
        fail(task, f"final scale: {scale:g} is not GradScaler's")
    passed(
        task,
        f"fp16-mixed run matches torch.amp.GradScaler over {len(ref_skipped)} steps: the same "
        "steps skipped (overflows at the start), same weights, same final scale",
    )


check_fp16_training = split_check(collect_fp16_training, judge_fp16_training)
