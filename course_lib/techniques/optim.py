"""Optimizer state: a from-scratch Adam, the optimizers of the unit, and what their state weighs.

Introduced in notebooks/04_optimizer_memory.ipynb.

* :class:`Adam` is Adam (Kingma & Ba 2014, arXiv:1412.6980, Algorithm 1) written from the update
  equations, with AdamW's decoupled weight decay (Loshchilov & Hutter 2017, arXiv:1711.05101) as
  an option. It is the reference of the exercise and is checked against ``torch.optim.Adam`` /
  ``torch.optim.AdamW`` in tests/techniques/test_optim.py.
* :func:`make_optimizer` builds each optimizer of the unit with the library users actually use:
  ``torch.optim`` for SGD, momentum, RMSprop, Adagrad, Adam, AdamW and ``bitsandbytes`` for 8-bit
  Adam (Dettmers et al. 2021, arXiv:2110.02861; its CPU backend runs on any x86 CPU).
* :func:`state_bytes` counts the bytes an optimizer's state really holds, by kind.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Iterable

import torch

from course_lib import validate
from course_lib.measure import estimate

__all__ = ["OPTIMIZERS", "Adam", "make_optimizer", "state_bytes", "import_bitsandbytes"]

#: optimizers of the unit (the same names as ``course_lib.measure.estimate.OPTIMIZERS``)
OPTIMIZERS = estimate.OPTIMIZERS  # one table of optimizers for the whole course


class Adam(torch.optim.Optimizer):
    """Adam from the update equations (AdamW with ``decoupled=True``).

    For each parameter θ with gradient g at step t (state m, v start at 0)::

        g  <- g + λ θ                 (Adam's L2 weight decay, if not decoupled)
        θ  <- θ (1 - lr λ)            (AdamW's decoupled weight decay, if decoupled)
        m  <- β1 m + (1 - β1) g
        v  <- β2 v + (1 - β2) g²
        θ  <- θ - lr · (m / (1 - β1^t)) / (sqrt(v / (1 - β2^t)) + ε)

    State per parameter: ``exp_avg`` (m) and ``exp_avg_sq`` (v), each the parameter's shape and
    dtype -- 8 bytes per fp32 parameter -- and a Python int ``step`` (torch.optim keeps a
    4-byte tensor instead). Written in the same order of operations as torch.optim's
    single-tensor path, so it matches it to a few ulps.

    ``state_dtype`` (default: the parameter's dtype, as torch.optim) keeps m and v in another
    dtype: ``torch.float32`` for bf16 parameters is the "12 bytes per parameter" recipe (bf16
    params 2 + bf16 grads 2 + fp32 m, v 8, no master copy). The update is then computed in fp32
    and rounded once into the 16-bit parameter, so updates below half its spacing are lost
    (notebooks/04_optimizer_memory.ipynb, section 5).
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        *,
        decoupled: bool = False,
        state_dtype: torch.dtype | None = None,
    ) -> None:
        validate.number("lr", lr, minimum=0)
        if not (len(betas) == 2 and all(0 <= b < 1 for b in betas)):
            raise ValueError(f"betas = {betas!r}: expected two numbers in [0, 1)")
        validate.number("eps", eps, minimum=0)
        validate.number("weight_decay", weight_decay, minimum=0)
        if state_dtype is not None and not (
            isinstance(state_dtype, torch.dtype) and state_dtype.is_floating_point
        ):
            raise ValueError(
                f"state_dtype = {state_dtype!r}: expected None or a floating torch.dtype "
                "(torch.float32, torch.bfloat16, ...)"
            )
        super().__init__(
            params,
            dict(
                lr=lr,
                betas=tuple(betas),
                eps=eps,
                weight_decay=weight_decay,
                decoupled=bool(decoupled),
            ),
        )
        self.state_dtype = state_dtype

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, (beta1, beta2), eps, wd = (
                group["lr"],
                group["betas"],
                group["eps"],
                group["weight_decay"],
            )
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                state = self.state[p]
                sdt = self.state_dtype or p.dtype
                if not state:  # lazily, like torch.optim: no state before the first step
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(
                        p, dtype=sdt, memory_format=torch.preserve_format
                    )
                    state["exp_avg_sq"] = torch.zeros_like(
                        p, dtype=sdt, memory_format=torch.preserve_format
                    )
                stored = p
                if sdt != p.dtype:  # compute in the state's dtype, round once into p at the end
                    p, g = p.to(sdt), g.to(sdt)
                m, v = state["exp_avg"], state["exp_avg_sq"]
                state["step"] += 1
                t = state["step"]
                if wd != 0:
                    if group["decoupled"]:
                        p.mul_(1 - lr * wd)
                    else:
                        g = g.add(p, alpha=wd)
                m.lerp_(g, 1 - beta1)  # m = β1 m + (1-β1) g
                v.mul_(beta2).addcmul_(g, g, value=1 - beta2)  # v = β2 v + (1-β2) g²
                step_size = lr / (1 - beta1**t)
                denom = (v.sqrt() / math.sqrt(1 - beta2**t)).add_(eps)
                p.addcdiv_(m, denom, value=-step_size)
                if p is not stored:
                    stored.copy_(p)
        return loss


# --------------------------------------------------------------------------------------------
# the optimizers of the unit
# --------------------------------------------------------------------------------------------
def import_bitsandbytes():
    """Import bitsandbytes quietly (its CPU backend logs a warning about an optional 4-bit
        matmul kernel we do not use). Missing (``make lab`` leaves it out), an ImportError naming the
    command that installs it."""
    from course_lib.runtime.compat import import_optional

    logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
    return import_optional("bitsandbytes", extra="adam8bit", needed_for="optimizer='adam8bit'")


def make_optimizer(
    name: str, params: Iterable[Any], *, lr: float, **kwargs: Any
) -> torch.optim.Optimizer:
    """The optimizer ``name`` of :data:`OPTIMIZERS` over ``params``, from the library.

    ``momentum`` is SGD with momentum 0.9; ``adam8bit`` is ``bitsandbytes.optim.Adam8bit``
    (blockwise 8-bit moments; tensors with fewer than ``min_8bit_size=4096`` elements keep
    32-bit state -- the library's default, on purpose: small tensors gain nothing).
    Extra keyword arguments go to the constructor.
    """
    validate.choice("name", name, OPTIMIZERS)
    validate.number("lr", lr, positive=True)
    if isinstance(params, (torch.nn.Module, torch.optim.Optimizer)) or not isinstance(
        params, Iterable
    ):
        raise TypeError(
            f"params = {validate.describe(params)}: expected the tensors to optimize, "
            "e.g. model.parameters()"
        )
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, **kwargs)
    if name == "momentum":
        return torch.optim.SGD(params, lr=lr, **{"momentum": 0.9, **kwargs})
    if name == "rmsprop":
        return torch.optim.RMSprop(params, lr=lr, **kwargs)
    if name == "adagrad":
        return torch.optim.Adagrad(params, lr=lr, **kwargs)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, **kwargs)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, **kwargs)
    bnb = import_bitsandbytes()
    return bnb.optim.Adam8bit(params, lr=lr, **kwargs)


def state_bytes(optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Bytes held by ``optimizer.state``, by kind, each storage counted once.

    * ``moments``: tensors with as many elements as their parameter (m, v, momentum buffers;
      8-bit ones weigh 1 byte per element);
    * ``step``: 0-dim tensors (torch.optim's per-tensor ``step`` counters, 4 bytes each);
    * ``quant_meta``: everything else (bitsandbytes' per-block ``absmax`` and its shared
      256-entry ``qmap`` code books);
    * ``total``: the sum. Python numbers in the state (an int ``step``) weigh 0 here.
    """
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(
            f"optimizer = {validate.describe(optimizer)}: expected a torch.optim.Optimizer"
        )
    out = {"moments": 0, "step": 0, "quant_meta": 0}
    seen: set[int] = set()
    for p, st in optimizer.state.items():
        for t in st.values():
            if not isinstance(t, torch.Tensor):
                continue
            key = t.untyped_storage().data_ptr()
            if key in seen and t.untyped_storage().nbytes() > 0:
                continue
            seen.add(key)
            nbytes = t.numel() * t.element_size()
            if t.dim() == 0:
                out["step"] += nbytes
            elif isinstance(p, torch.Tensor) and t.numel() == p.numel():
                out["moments"] += nbytes
            else:
                out["quant_meta"] += nbytes
    out["total"] = sum(out.values())
    return out


# --------------------------------------------------------------------------------------------
# the classic mixed-precision recipe: 16-bit model, fp32 master weights in the optimizer
# --------------------------------------------------------------------------------------------
class MasterWeights:
    """A 16-bit model trained through an fp32 master copy (Micikevicius et al. 2017,
    arXiv:1710.03740, Sec. 3.1) -- the recipe behind the "16 bytes per parameter" of the ZeRO
    paper: 16-bit params (2) + 16-bit grads (2) + fp32 master (4) + Adam m, v (8).

    ``step()`` casts the 16-bit gradients to fp32 ``.grad`` of the master copy (4 more bytes per
    parameter, alive only during the step: the "fp32 gradients" some accountings add), steps the
    inner optimizer on the master, copies the master back into the 16-bit weights and frees the
    fp32 gradients. ``torch.autocast`` does not work this way: it keeps fp32 parameters and casts
    per op (see notebooks/03_mixed_precision.ipynb).
    """

    def __init__(
        self, model: torch.nn.Module, name: str = "adam", *, lr: float, **kwargs: Any
    ) -> None:
        self.params = [p for p in model.parameters() if p.requires_grad]
        bad = sorted(
            {str(p.dtype) for p in self.params if p.dtype not in (torch.float16, torch.bfloat16)}
        )
        if bad:
            raise ValueError(
                f"model parameters must be float16/bfloat16 for MasterWeights, got {bad}; "
                "cast the model first (model.to(torch.bfloat16))"
            )
        self.master = [torch.nn.Parameter(p.detach().float().clone()) for p in self.params]
        self.optimizer = make_optimizer(name, self.master, lr=lr, **kwargs)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None if set_to_none else (p.grad.zero_() if p.grad is not None else None)

    @torch.no_grad()
    def step(self) -> None:
        for p, m in zip(self.params, self.master):
            m.grad = None if p.grad is None else p.grad.float()  # fp32 grads, for this step only
        self.optimizer.step()
        for p, m in zip(self.params, self.master):
            p.copy_(m)  # round the updated master back to 16 bits
            m.grad = None  # free the fp32 gradients
