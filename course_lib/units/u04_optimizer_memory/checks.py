"""Checks for the exercises of unit 04 (solutions/04_optimizer_memory.ipynb).

The learner writes Adam from its update equations as a ``torch.optim.Optimizer`` subclass built as
``MyAdam(params, lr=..., betas=..., eps=..., weight_decay=..., decoupled=...)``.

Tasks: 1-2 parity with ``torch.optim.Adam`` / ``AdamW`` over 5 steps; 3 the state's exact bytes
(``estimate.optimizer_state_bytes_per_param``; state in the parameter's dtype); 4 the peak of a
16-byte-recipe step on unseen MLPs within 1 % of MemoryMeter; 5 the fixed master-weights class
(the bug: the master overwritten by the rounded weights); 6 ZeRO-1 state per GPU at 7B and 70B.

Tolerance of tasks 1 and 2: rtol=1e-5, atol=1e-7. fp32 carries 24 significant bits (relative
spacing 6e-8); equivalent orders of operations (bias-correcting m before or after the division,
sqrt(v / c) or sqrt(v) / sqrt(c)) differ in the last bits, and 5 steps compound that to about
1e-6 relative at worst (the drawn learning rates stay at or below 1e-2). A wrong formula (missing bias correction, eps inside the sqrt, the wrong
weight decay) is off by 1e-3 or more.
"""

from __future__ import annotations

from typing import Any

from course_lib.grading.core import fail, passed, run_learner
from course_lib.grading.seeds import case_rng
from course_lib.units.u04_optimizer_memory.checks_master import (  # noqa: F401 (re-exported)
    MASTER_ATOL,
    MASTER_LR,
    MASTER_RTOL,
    MASTER_STEPS,
    check_master_bug,
)

UNIT = "u04_optimizer_memory"

#: the course's own answer (and PyTorch's, which the check compares with), out of reach while
#: the learner's code runs
_REFERENCES = (
    "course_lib.techniques.optim:Adam",
    "course_lib.techniques.optim:make_optimizer",
    "torch.optim.adam:Adam",
    "torch.optim.adamw:AdamW",
)


def _learner(task: int, fn, *args, **kwargs):
    """The learner's code, run with the course's own answer out of reach."""
    return run_learner(task, fn, *args, forbid=_REFERENCES, **kwargs)


__all__ = [
    "check_adam",
    "check_adamw",
    "check_adam_state_bytes",
    "check_predict_step_peak",
    "check_master_bug",
    "check_zero1_at_scale",
    "RTOL",
    "ATOL",
    "STEPS",
    "PEAK_WIDTHS",
    "PEAK_RTOL",
    "SCALE_MODELS",
]

RTOL, ATOL, STEPS = 1e-5, 1e-7, 5


def _shapes(task: int) -> tuple[tuple[int, ...], ...]:
    """A small MLP's weights and biases, sizes drawn from the grading seed."""
    rng = case_rng(task, UNIT)
    d_in, hidden, d_out = rng.randint(6, 24), rng.randint(8, 32), rng.randint(2, 8)
    return ((hidden, d_in), (hidden,), (d_out, hidden), (d_out,))


def _params(task: int, dtype=None):
    import torch

    g = torch.Generator().manual_seed(case_rng(task, UNIT).getrandbits(63))
    dtype = dtype or torch.float32
    return [torch.nn.Parameter(torch.randn(s, generator=g).to(dtype)) for s in _shapes(task)]


def _grads(task: int, step: int):
    import torch

    g = torch.Generator().manual_seed(case_rng(task, UNIT).getrandbits(63) + 100 + step)
    return [torch.randn(s, generator=g) for s in _shapes(task)]


def _hyper(task: int) -> dict[str, Any]:
    """Learning rate and betas drawn from the grading seed (eps stays torch's default)."""
    rng = case_rng(task, UNIT)
    rng.random()  # the draws of _shapes and _params come first
    lr = rng.choice((1e-3, 2e-3, 3e-3, 5e-3, 1e-2))
    return dict(lr=lr, betas=(rng.choice((0.8, 0.85, 0.9)), rng.choice((0.95, 0.98, 0.999))))


def _run(make_opt, *, task: int, learner: bool, steps: int = STEPS):
    params = _params(task)
    opt = _learner(task, make_opt, params) if learner else make_opt(params)
    for t in range(steps):
        for p, g in zip(params, _grads(task, t)):
            p.grad = g.clone()
        if learner:
            _learner(task, opt.step)
        else:
            opt.step()
    return [p.detach() for p in params]


def _compare(task: int, what: str, got, expected) -> None:
    import torch

    for i, (p, r) in enumerate(zip(got, expected)):
        if not bool(torch.isfinite(p).all()):
            fail(task, f"{what}: parameter {i} has inf/NaN after {STEPS} steps")
        if not torch.allclose(p, r, rtol=RTOL, atol=ATOL):
            start = _params(task)[i].detach()
            moved = float((r - start).abs().max())
            err = float((p - r).abs().max())
            hint = (
                " (the parameters did not move: does step() update p in place?)"
                if float((p - start).abs().max()) == 0
                else ""
            )
            fail(
                task,
                f"{what}: parameter {i} (shape {tuple(p.shape)}) differs from torch.optim after "
                f"{STEPS} steps: max abs error {err:.3g}, while the update itself is {moved:.3g} "
                f"(rtol={RTOL:g}, atol={ATOL:g}){hint}",
            )


def check_adam(MyAdam, task: int = 1) -> None:
    """Parity with torch.optim.Adam: lr=1e-2 default betas, weight_decay 0 and 0.1 (L2)."""
    import torch

    hyper = _hyper(task)
    for wd in (0.0, 0.1):
        kw = dict(**hyper, eps=1e-8, weight_decay=wd)
        expected = _run(lambda ps, kw=kw: torch.optim.Adam(ps, **kw), task=task, learner=False)
        got = _run(lambda ps, kw=kw: MyAdam(ps, decoupled=False, **kw), task=task, learner=True)
        what = f"Adam(lr={hyper['lr']:g}, betas={hyper['betas']}, weight_decay={wd:g})"
        _compare(task, what, got, expected)
    passed(
        task,
        f"MyAdam matches torch.optim.Adam over {STEPS} steps, weight_decay 0 and 0.1 "
        f"(rtol={RTOL:g}, atol={ATOL:g})",
    )


def check_adamw(MyAdam, task: int = 2) -> None:
    """Parity with torch.optim.AdamW (decoupled weight decay 0.1)."""
    import torch

    hyper = _hyper(task)
    kw: dict[str, Any] = dict(**hyper, eps=1e-8, weight_decay=0.1)
    expected = _run(lambda ps: torch.optim.AdamW(ps, **kw), task=task, learner=False)
    got = _run(lambda ps: MyAdam(ps, decoupled=True, **kw), task=task, learner=True)
    what = f"AdamW(lr={hyper['lr']:g}, betas={hyper['betas']}, weight_decay=0.1)"
    _compare(task, what, got, expected)
    passed(
        task,
        f"MyAdam(decoupled=True) matches torch.optim.AdamW over {STEPS} steps "
        f"(rtol={RTOL:g}, atol={ATOL:g})",
    )


def check_adam_state_bytes(MyAdam, task: int = 3) -> None:
    """State bytes, exactly: 8 per fp32 parameter, 4 per bf16 parameter (0-dim step counters and
    Python numbers are not counted)."""
    import torch

    from course_lib.measure import estimate
    from course_lib.techniques.optim import state_bytes

    for dtype, width in ((torch.float32, 4), (torch.bfloat16, 2)):
        params = _params(task, dtype)
        n = sum(p.numel() for p in params)
        opt = _learner(task, MyAdam, params, lr=1e-3)
        for p, g in zip(params, _grads(task, 0)):
            p.grad = g.to(dtype)
        _learner(task, opt.step)
        sb = state_bytes(opt)
        got = sb["moments"] + sb["quant_meta"]
        expected = estimate.optimizer_state_bytes_per_param("adam", state_dtype_bytes=width) * n
        if got != expected:
            dtypes = sorted(
                {
                    str(t.dtype)
                    for st in opt.state.values()
                    for t in st.values()
                    if isinstance(t, torch.Tensor) and t.dim() > 0
                }
            )
            fail(
                task,
                f"{dtype} parameters ({n} elements): {got} bytes of state is not m and v at "
                f"{width} bytes each per element, in tensors of "
                f"dtype {dtypes or 'none'} (keep m and v in the parameter's dtype: torch.zeros_like(p))",
            )
    passed(
        task,
        f"state = {estimate.optimizer_state_bytes_per_param('adam')} bytes per fp32 parameter "
        f"and {estimate.optimizer_state_bytes_per_param('adam', state_dtype_bytes=2)} per bf16 "
        "parameter, on an unseen MLP's tensors",
    )


# ---------------------------------------------------------------------------------- task 4
#: task 4's MLPs of the default seed (widths in, hidden..., out; every Linear has a bias):
#: configurations the lecture never showed; :func:`peak_widths` draws them per seed
PEAK_WIDTHS = ((300, 1000, 700, 50), (96, 2048, 128))


def peak_widths(task: int = 4) -> tuple[tuple[int, ...], ...]:
    """Two MLPs drawn from the grading seed: a deep one and a wide one (its largest layer the
    largest scratch tensor)."""
    rng = case_rng(task, UNIT)
    deep = (
        rng.randint(100, 400),
        rng.randint(500, 1200),
        rng.randint(300, 900),
        rng.randint(8, 64),
    )
    wide = (rng.randint(48, 160), rng.randint(1500, 2500), rng.randint(64, 256))
    return deep, wide


#: task 4's tolerance on the predicted peak, relative. The step counters (4 B per tensor) and the
#: one small tensor torch.optim's loop still holds from the previous parameter stay far below it;
#: forgetting the fp32 gradients, or one of the two scratch tensors, does not.
PEAK_RTOL = 0.01
_FORBID_4 = (
    "course_lib.measure.memory:MemoryMeter",
    "course_lib.measure.estimate.memory:model_state_bytes",
    "course_lib.measure.estimate.memory:optimizer_state_bytes_per_param",
    "course_lib.units.u04_optimizer_memory.run:mixed_precision_accounting",
)


def _measured_master_step_peak(widths) -> int:
    """MemoryMeter's peak around the second step of the 16-byte recipe: a bf16 MLP, an fp32 master
    copy, torch.optim.Adam on the master (course_lib.techniques.optim.MasterWeights)."""
    import torch

    from course_lib.measure.memory import MemoryMeter
    from course_lib.models import MLP, MLPConfig
    from course_lib.techniques.optim import MasterWeights

    torch.manual_seed(0)
    model = MLP(MLPConfig(widths[0], tuple(widths[1:-1]), widths[-1])).to(torch.bfloat16)
    mw = MasterWeights(model, "adam", lr=1e-3)
    x = torch.randn(4, widths[0], dtype=torch.bfloat16)
    for step in range(2):  # the first step creates Adam's state; the second is measured
        mw.zero_grad()
        model(x).float().pow(2).mean().backward()
        if step == 0:
            mw.step()
            continue
        with MemoryMeter(model, mw.optimizer, track=mw.master) as mem:
            mw.step()
    return int(mem.peak_bytes)


def check_predict_step_peak(predict_step_peak, task: int = 4) -> None:
    """The peak of one step of the 16-byte recipe, predicted, against MemoryMeter (within 1 %)."""
    from course_lib.grading.core import expect_int

    widths_drawn = peak_widths(task)
    for widths in widths_drawn:
        got = expect_int(
            task,
            f"predict_step_peak({list(widths)})",
            run_learner(task, predict_step_peak, list(widths), forbid=_FORBID_4),
        )
        measured = _measured_master_step_peak(widths)
        if not abs(got - measured) <= PEAK_RTOL * measured:
            n = sum(a * b + b for a, b in zip(widths[:-1], widths[1:]))
            fail(
                task,
                f"widths {list(widths)} ({n:,} parameters): you predicted {got:,} B "
                f"({got / n:.2f} B/param), not within {PEAK_RTOL:.0%} of the peak MemoryMeter "
                "measured during the step. At rest the recipe holds 16 B/param: "
                "what does the step add, and how large is the largest single piece of scratch?",
            )
    passed(
        task,
        f"the step's peak predicted within {PEAK_RTOL:.0%} of MemoryMeter's for "
        f"{len(widths_drawn)} MLPs the lecture did not show",
    )


# ---------------------------------------------------------------------------------- task 6
#: task 6's models: Llama-2-7B's and Llama-2-70B's parameter counts (Touvron et al. 2023)
SCALE_MODELS = {"7B": 6_738_415_616, "70B": 68_976_648_192}
SCALE_WORLDS = (1, 8, 64)
_FORBID_6 = (
    "course_lib.measure.estimate.zero:zero_bytes_per_rank",
    "course_lib.measure.estimate.zero:zero_state_breakdown_per_rank",
    "course_lib.measure.estimate.memory:model_state_bytes",
    "course_lib.measure.estimate.memory:optimizer_state_bytes_per_param",
)


def check_zero1_at_scale(zero1_bytes, task: int = 6) -> None:
    """Model state per GPU under ZeRO stage 1, 16-byte and 12-byte accountings, 7B and 70B, against
    ``estimate.zero_bytes_per_rank`` (k = 12 with the master copy, 8 without)."""
    from course_lib.grading.core import expect_int
    from course_lib.measure import estimate

    rng = case_rng(task, UNIT)
    # a drawn size and world size; every world size divides every size, as with the Llama counts
    models = {**SCALE_MODELS, "drawn": 256 * rng.randint(4_000_000, 1_500_000_000)}
    worlds = (*SCALE_WORLDS, rng.choice((2, 4, 16, 32, 128, 256)))
    for name, n in models.items():
        for master in (True, False):
            for world in worlds:
                got = expect_int(
                    task,
                    f"zero1_bytes({n:,}, {world}, master={master})",
                    run_learner(task, zero1_bytes, n, world, master, forbid=_FORBID_6),
                )
                expected = estimate.zero_bytes_per_rank(
                    n, stage=1, world_size=world, k=12 if master else 8
                )
                if got != expected:
                    what = "16-byte (fp32 master)" if master else "12-byte (no master)"
                    fail(
                        task,
                        f"{name} ({n:,} parameters), {what} accounting, ZeRO-1 over {world} GPU(s): "
                        f"{got:,} B per GPU is not the ZeRO-1 model state. Which parts are sharded, "
                        "and which stay whole on every GPU?",
                    )
    seven = estimate.zero_bytes_per_rank(SCALE_MODELS["7B"], stage=1, world_size=1, k=12)
    seventy = estimate.zero_bytes_per_rank(SCALE_MODELS["70B"], stage=1, world_size=64, k=8)
    passed(
        task,
        f"{len(models) * 2 * len(worlds)} configurations equal estimate's ZeRO-1 bytes "
        f"(7B unsharded, 16 B/param: {seven / 1e9:.1f} GB; 70B over 64 GPUs, 12 B/param: "
        f"{seventy / 1e9:.1f} GB per GPU)",
    )
