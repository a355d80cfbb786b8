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
1e-6 relative at worst. A wrong formula (missing bias correction, eps inside the sqrt, the wrong
weight decay) is off by 1e-3 or more.
"""

from __future__ import annotations

from typing import Any

from course_lib.grading.core import fail, passed, run_learner

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
_SHAPES = ((16, 8), (16,), (4, 16), (4,))  # a small MLP's weights and biases: 212 parameters


def _params(dtype=None, seed: int = 0):
    import torch

    g = torch.Generator().manual_seed(seed)
    dtype = dtype or torch.float32
    return [torch.nn.Parameter(torch.randn(s, generator=g).to(dtype)) for s in _SHAPES]


def _grads(step: int):
    import torch

    g = torch.Generator().manual_seed(100 + step)
    return [torch.randn(s, generator=g) for s in _SHAPES]


def _run(make_opt, *, task: int, learner: bool, steps: int = STEPS):
    params = _params()
    opt = _learner(task, make_opt, params) if learner else make_opt(params)
    for t in range(steps):
        for p, g in zip(params, _grads(t)):
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
            start = _params()[i].detach()
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

    for wd in (0.0, 0.1):
        kw = dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=wd)
        expected = _run(lambda ps, kw=kw: torch.optim.Adam(ps, **kw), task=task, learner=False)
        got = _run(lambda ps, kw=kw: MyAdam(ps, decoupled=False, **kw), task=task, learner=True)
        _compare(task, f"Adam(lr=1e-2, weight_decay={wd:g})", got, expected)
    passed(
        task,
        f"MyAdam matches torch.optim.Adam over {STEPS} steps, weight_decay 0 and 0.1 "
        f"(rtol={RTOL:g}, atol={ATOL:g})",
    )


def check_adamw(MyAdam, task: int = 2) -> None:
    """Parity with torch.optim.AdamW (decoupled weight decay 0.1)."""
    import torch

    kw: dict[str, Any] = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    expected = _run(lambda ps: torch.optim.AdamW(ps, **kw), task=task, learner=False)
    got = _run(lambda ps: MyAdam(ps, decoupled=True, **kw), task=task, learner=True)
    _compare(task, "AdamW(lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)", got, expected)
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
        params = _params(dtype)
        n = sum(p.numel() for p in params)
        opt = _learner(task, MyAdam, params, lr=1e-3)
        for p, g in zip(params, _grads(0)):
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
                f"{dtype} parameters ({n} elements): expected {expected} bytes of state "
                f"(m and v, {width} bytes each per element), got {got} bytes in tensors of "
                f"dtype {dtypes or 'none'} (keep m and v in the parameter's dtype: torch.zeros_like(p))",
            )
    passed(
        task,
        f"state = {estimate.optimizer_state_bytes_per_param('adam')} bytes per fp32 parameter "
        f"and {estimate.optimizer_state_bytes_per_param('adam', state_dtype_bytes=2)} per bf16 "
        f"parameter ({n} parameters)",
    )


# ---------------------------------------------------------------------------------- task 4
#: task 4's MLPs (widths in, hidden..., out; every Linear has a bias): configurations the lecture
#: never showed
PEAK_WIDTHS = ((300, 1000, 700, 50), (96, 2048, 128))
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

    for widths in PEAK_WIDTHS:
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
                f"widths {list(widths)} ({n:,} parameters): MemoryMeter measured a peak of "
                f"{measured:,} B ({measured / n:.2f} B/param) during the step, you predicted {got:,} B "
                f"({got / n:.2f} B/param); tolerance {PEAK_RTOL:.0%}. At rest the recipe holds 16 B/param: "
                "what does the step add, and how large is the largest single piece of scratch?",
            )
    passed(
        task,
        f"the step's peak predicted within {PEAK_RTOL:.0%} of MemoryMeter's for "
        f"{len(PEAK_WIDTHS)} MLPs the lecture did not show",
    )


# ---------------------------------------------------------------------------------- task 5
#: task 5's run: steps, learning rate (small: Adam moves each weight by about lr per step, below
#: half of bf16's spacing for most weights) and tolerance on the master copy (same ops in fp32:
#: equal to a few ulps)
MASTER_STEPS, MASTER_LR, MASTER_RTOL, MASTER_ATOL = 12, 1e-4, 1e-5, 1e-7


def _master_task():
    import torch

    from course_lib.models import MLP, MLPConfig

    torch.manual_seed(3)
    model = MLP(MLPConfig(32, (64,), 8)).to(torch.bfloat16)
    gen = torch.Generator().manual_seed(4)
    batches = [
        (torch.randn(16, 32, generator=gen).to(torch.bfloat16), torch.randn(16, 8, generator=gen))
        for _ in range(MASTER_STEPS)
    ]
    return model, batches


def _master_reference():
    """The recipe done right, written out (not the learner's code)."""
    import torch

    model, batches = _master_task()
    params = list(model.parameters())
    master = [p.detach().float().clone().requires_grad_(True) for p in params]
    opt = torch.optim.Adam(master, lr=MASTER_LR)
    for x, y in batches:
        for p in params:
            p.grad = None
        (model(x).float() - y).pow(2).mean().backward()
        with torch.no_grad():
            for p, m in zip(params, master):
                m.grad = p.grad.float()
            opt.step()
            for p, m in zip(params, master):
                p.copy_(m)
    return [p.detach().clone() for p in params], [m.detach().clone() for m in master]


def _same_as_reference(task: int, master: list, ref_m: list, weights: list) -> None:
    """✗ unless the master equals the recipe done right and the weights are it rounded to bf16."""
    import torch

    for i, (m, r) in enumerate(zip(master, ref_m)):
        if not torch.allclose(m, r, rtol=MASTER_RTOL, atol=MASTER_ATOL):
            fail(
                task,
                f"master tensor {i}: differs from the recipe done right after {MASTER_STEPS} steps, "
                f"max abs error {float((m - r).abs().max()):.3g} (rtol={MASTER_RTOL:g}, atol={MASTER_ATOL:g})",
            )
    for i, (w, m) in enumerate(zip(weights, master)):
        if not torch.equal(w, m.to(torch.bfloat16)):
            fail(
                task,
                f"parameter {i}: the bf16 weights are not the master rounded to bf16 after the last step",
            )


def check_master_bug(MyMaster, task: int = 5) -> None:
    """The fixed master-weights class: same fp32 master and bf16 weights as the recipe done right."""
    import torch

    forbid = ("course_lib.techniques.optim:MasterWeights",)
    ref_w, ref_m = _master_reference()
    model, batches = _master_task()
    start = [p.detach().clone() for p in model.parameters()]
    mw = run_learner(task, MyMaster, model, lr=MASTER_LR, forbid=forbid)
    for x, y in batches:
        run_learner(task, mw.zero_grad, forbid=forbid)
        (model(x).float() - y).pow(2).mean().backward()
        run_learner(task, mw.step, forbid=forbid)
    master = list(getattr(mw, "master", None) or [])
    if len(master) != len(ref_m) or any(m.dtype != torch.float32 for m in master):
        fail(
            task,
            f"expected .master to be the {len(ref_m)} fp32 master tensors, got "
            f"{[str(getattr(m, 'dtype', type(m).__name__)) for m in master]}",
        )
    weights = [p.detach() for p in model.parameters()]
    if all(torch.equal(w, s) for w, s in zip(weights, start)):
        fail(
            task,
            f"after {MASTER_STEPS} steps at lr={MASTER_LR:g} the bf16 weights never changed: "
            "does the updated master reach the model?",
        )
    if all(torch.equal(m, m.to(torch.bfloat16).float()) for m in master):
        fail(
            task,
            "every master value is a bf16 number: the master copy keeps nothing finer than the "
            "16-bit weights. Something overwrites it with the rounded weights",
        )
    _same_as_reference(task, master, ref_m, weights)
    moved = sum(int((w != s).sum()) for w, s in zip(ref_w, start))
    total = sum(s.numel() for s in start)
    passed(
        task,
        f"the master copy accumulates what bf16 cannot hold: {MASTER_STEPS} steps at lr={MASTER_LR:g} "
        f"match the recipe done right ({moved:,} of {total:,} bf16 weights moved)",
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

    for name, n in SCALE_MODELS.items():
        for master in (True, False):
            for world in SCALE_WORLDS:
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
                        f"expected {expected:,} B per GPU, got {got:,} B. Which parts are sharded, and "
                        "which stay whole on every GPU?",
                    )
    seven = estimate.zero_bytes_per_rank(SCALE_MODELS["7B"], stage=1, world_size=1, k=12)
    seventy = estimate.zero_bytes_per_rank(SCALE_MODELS["70B"], stage=1, world_size=64, k=8)
    passed(
        task,
        f"{2 * 2 * len(SCALE_WORLDS)} configurations equal estimate's ZeRO-1 bytes "
        f"(7B unsharded, 16 B/param: {seven / 1e9:.1f} GB; 70B over 64 GPUs, 12 B/param: "
        f"{seventy / 1e9:.1f} GB per GPU)",
    )
