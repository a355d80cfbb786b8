"""Checks for the exercises of unit 04 (solutions/04_optimizer_memory.ipynb).

The learner writes Adam from its update equations as a ``torch.optim.Optimizer`` subclass built as
``MyAdam(params, lr=..., betas=..., eps=..., weight_decay=..., decoupled=...)``.

Task 1: parity with ``torch.optim.Adam`` over 5 steps, with and without (L2) weight decay.
Task 2: parity with ``torch.optim.AdamW`` (decoupled weight decay) over 5 steps.
Task 3: the state's size in bytes, exactly: ``estimate.optimizer_state_bytes_per_param("adam")``
per fp32 parameter, half that for bf16 parameters (state in the parameter's dtype, as torch.optim).

Tolerance of tasks 1 and 2: rtol=1e-5, atol=1e-7. fp32 carries 24 significant bits (relative
spacing 6e-8); equivalent orders of operations (bias-correcting m before or after the division,
sqrt(v / c) or sqrt(v) / sqrt(c)) differ in the last bits, and 5 steps compound that to about
1e-6 relative at worst. A wrong formula (missing bias correction, eps inside the sqrt, the wrong
weight decay) is off by 1e-3 or more.
"""
from __future__ import annotations

from course_lib.grading.core import fail, passed, run_learner

#: the course's own answer (and PyTorch's, which the check compares with), out of reach while
#: the learner's code runs
_REFERENCES = ("course_lib.techniques.optim:Adam", "course_lib.techniques.optim:make_optimizer",
               "torch.optim.adam:Adam", "torch.optim.adamw:AdamW")


def _learner(task: int, fn, *args, **kwargs):
    """The learner's code, run with the course's own answer out of reach."""
    return run_learner(task, fn, *args, forbid=_REFERENCES, **kwargs)

__all__ = ["check_adam", "check_adamw", "check_adam_state_bytes", "RTOL", "ATOL", "STEPS"]

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
            hint = " (the parameters did not move: does step() update p in place?)" \
                if float((p - start).abs().max()) == 0 else ""
            fail(task, f"{what}: parameter {i} (shape {tuple(p.shape)}) differs from torch.optim after "
                       f"{STEPS} steps: max abs error {err:.3g}, while the update itself is {moved:.3g} "
                       f"(rtol={RTOL:g}, atol={ATOL:g}){hint}")


def check_adam(MyAdam, task: int = 1) -> None:
    """Parity with torch.optim.Adam: lr=1e-2 default betas, weight_decay 0 and 0.1 (L2)."""
    import torch

    for wd in (0.0, 0.1):
        kw = dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=wd)
        expected = _run(lambda ps, kw=kw: torch.optim.Adam(ps, **kw), task=task, learner=False)
        got = _run(lambda ps, kw=kw: MyAdam(ps, decoupled=False, **kw), task=task, learner=True)
        _compare(task, f"Adam(lr=1e-2, weight_decay={wd:g})", got, expected)
    passed(task, f"MyAdam matches torch.optim.Adam over {STEPS} steps, weight_decay 0 and 0.1 "
                 f"(rtol={RTOL:g}, atol={ATOL:g})")


def check_adamw(MyAdam, task: int = 2) -> None:
    """Parity with torch.optim.AdamW (decoupled weight decay 0.1)."""
    import torch

    kw = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    expected = _run(lambda ps: torch.optim.AdamW(ps, **kw), task=task, learner=False)
    got = _run(lambda ps: MyAdam(ps, decoupled=True, **kw), task=task, learner=True)
    _compare(task, "AdamW(lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)", got, expected)
    passed(task, f"MyAdam(decoupled=True) matches torch.optim.AdamW over {STEPS} steps "
                 f"(rtol={RTOL:g}, atol={ATOL:g})")


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
            dtypes = sorted({str(t.dtype) for st in opt.state.values() for t in st.values()
                             if isinstance(t, torch.Tensor) and t.dim() > 0})
            fail(task, f"{dtype} parameters ({n} elements): expected {expected} bytes of state "
                       f"(m and v, {width} bytes each per element), got {got} bytes in tensors of "
                       f"dtype {dtypes or 'none'} (keep m and v in the parameter's dtype: torch.zeros_like(p))")
    passed(task, f"state = {estimate.optimizer_state_bytes_per_param('adam')} bytes per fp32 parameter "
                 f"and {estimate.optimizer_state_bytes_per_param('adam', state_dtype_bytes=2)} per bf16 "
                 f"parameter ({n} parameters)")
