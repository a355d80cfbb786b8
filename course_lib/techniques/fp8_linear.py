"""``Float8Linear``: an ``nn.Linear`` whose three matmuls run in FP8, from scratch.

A linear layer ``y = x W^T`` does three GEMMs per training step, each on FP8 operands cast with a
scale along the GEMM's contraction dimension (``techniques.fp8``):

* forward  ``y  = x  @ W^T``   x (M, K) and W (N, K), both E4M3, scaled along K;
* backward ``dx = dy @ W``     dy (M, N) and W^T (K, N), scaled along N;
* backward ``dW = dy^T @ x``   dy^T (N, M) and x^T (K, M), scaled along M (the tokens).

The master weight stays the ``nn.Parameter`` it was (fp32 here): the optimizer updates it and
the next forward casts it again. Like torchao, the layer saves its high-precision input and
weight for backward and casts them again along the other dimension there (a rowwise scale along
K is no use for a GEMM that contracts over M). The bias is added in high precision.

Inputs: ``x`` (..., in_features), floating point, refused with a message naming
``in_features`` before any cast otherwise; an empty batch (0 rows) gives a 0-row output and a
backward of zeros (dW = 0, the sum over no tokens), under every recipe.

Recipes (:data:`RECIPES`):

* ``"tensorwise"``: current scaling, one scale per tensor, E5M2 gradients (the hybrid format of
  Micikevicius et al. 2022, arXiv:2209.05433; torchao's default);
* ``"rowwise"``: one scale per row, E4M3 for everything, power-of-two scales (torchao's
  "rowwise" recipe);
* ``"blockwise"``: 1 x 128 tiles for activations and gradients, 128 x 128 blocks for weights,
  E4M3 for everything (DeepSeek-V3, arXiv:2412.19437, Sec. 3.3.2); dimensions must divide;
* ``"delayed"``: one scale per tensor taken from the largest amax of the previous ``history``
  steps (Transformer Engine's delayed scaling), so on a GPU the cast need not wait for a
  reduction over the tensor it casts. A spike larger than the history saturates.
* ``"unscaled"``: a plain cast (scale 1), the counter-example: small gradients flush to 0.

Introduced in notebooks/17_fp8_training.ipynb.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any, cast

import torch
from torch import nn

from course_lib import validate
from course_lib.techniques.fp8 import (
    Float8Data,
    Scaling,
    _check_input,
    as_2d,
    fp8_matmul,
    fp8_max,
    to_float8,
)

__all__ = [
    "Float8Recipe",
    "RECIPES",
    "recipe_of",
    "Float8Linear",
    "convert_to_float8",
    "float8_layers",
]

_ROLES = ("input", "weight", "grad")


@dataclass(frozen=True)
class Float8Recipe:
    """How a :class:`Float8Linear` casts its three operands."""

    name: str
    """the recipe's name"""
    scaling: Scaling
    """tensorwise, rowwise or blockwise (weights get block x block blocks under blockwise)"""
    grad_dtype: str = "e5m2"
    """format of the output gradient (inputs and weights are always E4M3)"""
    block: int = 128
    """tile width of blockwise scaling"""
    delayed: bool = False
    """scale from the amax history of earlier steps instead of the tensor being cast"""
    history: int = 16
    """steps of amax history kept under delayed scaling"""
    power_of_2: bool = False
    """round scales to powers of two"""
    scaled: bool = True
    """False: cast with a scale of 1 (what goes wrong without a scale)"""

    def __post_init__(self) -> None:
        validate.choice("scaling", self.scaling, ("tensorwise", "rowwise", "blockwise"))
        validate.choice("grad_dtype", self.grad_dtype, ("e4m3", "e5m2"))
        validate.count("block", self.block, minimum=1)
        validate.count("history", self.history, minimum=1)
        if self.delayed and self.scaling != "tensorwise":
            raise ValueError(f"scaling = {self.scaling!r}: delayed scaling expects 'tensorwise'")


RECIPES: dict[str, Float8Recipe] = {
    r.name: r
    for r in (
        Float8Recipe("tensorwise", "tensorwise", "e5m2"),
        Float8Recipe("rowwise", "rowwise", "e4m3", power_of_2=True),
        Float8Recipe("blockwise", "blockwise", "e4m3"),
        Float8Recipe("delayed", "tensorwise", "e5m2", delayed=True),
        Float8Recipe("unscaled", "tensorwise", "e4m3", scaled=False),
    )
}


def recipe_of(recipe: str | Float8Recipe, *, block: int | None = None) -> Float8Recipe:
    """A recipe by name (or itself), with its block width replaced when ``block`` is given."""
    if not isinstance(recipe, Float8Recipe):
        recipe = RECIPES[validate.choice("recipe", recipe, RECIPES)]
    return recipe if block is None else replace(recipe, block=block)


class _Float8Matmul(torch.autograd.Function):
    """x2 (M, K), w (N, K) -> x2 @ w^T in FP8; both FP8 GEMMs of backward too."""

    @staticmethod
    def forward(ctx: Any, x2: torch.Tensor, w: torch.Tensor, layer: Float8Linear) -> torch.Tensor:
        ctx.save_for_backward(x2, w)  # high precision, cast again along the other dim
        ctx.layer = layer
        xq = layer._cast(x2, "input", "e4m3", record=True)  # along K
        wq = layer._cast(w, "weight", "e4m3", record=True)  # along K
        return layer._mm(xq, wq).to(x2.dtype)  # (M, N)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        x2, w = ctx.saved_tensors
        layer, g = ctx.layer, layer_grad_dtype(ctx.layer)
        dy = dy.contiguous()  # (M, N)
        dyq = layer._cast(dy, "grad", g, record=True)  # along N
        wtq = layer._cast(w.t().contiguous(), "weight", "e4m3")  # (K, N) along N
        dx = layer._mm(dyq, wtq)  # (M, K)
        dytq = layer._cast(dy.t().contiguous(), "grad", g)  # (N, M) along M
        xtq = layer._cast(x2.t().contiguous(), "input", "e4m3")  # (K, M) along M
        dw = layer._mm(dytq, xtq)  # (N, K)
        return dx.to(x2.dtype), dw.to(w.dtype), None


def layer_grad_dtype(layer: Float8Linear) -> str:
    return layer.recipe.grad_dtype


class Float8Linear(nn.Module):
    """A linear layer computing its matmuls in FP8 (module doc). Build it with
    :meth:`from_linear`; ``weight`` and ``bias`` are the original layer's Parameters.

    After each step: ``gemm`` says how the last GEMM ran (``"_scaled_mm"`` or ``"emulated"``);
    under delayed scaling ``amax_history[role]`` holds the last ``history`` amaxes and
    ``saturated[role]`` how many values of the last cast of that role were clamped.
    """

    def __init__(
        self, weight: torch.Tensor, bias: torch.Tensor | None, recipe: Float8Recipe, emulate: bool
    ) -> None:
        super().__init__()
        self.weight, self.bias, self.recipe, self.emulate = weight, bias, recipe, emulate
        self.out_features, self.in_features = weight.shape
        self.gemm = ""
        self.amax_history: dict[str, list[float]] = {r: [] for r in _ROLES}
        self.saturated: dict[str, int] = dict.fromkeys(_ROLES, 0)

    @classmethod
    def from_linear(
        cls,
        linear: nn.Linear,
        *,
        recipe: str | Float8Recipe = "tensorwise",
        block: int | None = None,
        emulate: bool = False,
    ) -> Float8Linear:
        """Wrap ``linear``'s own weight and bias (shared, not copied). ``emulate=True``
        multiplies dequantised operands in fp32 even where ``torch._scaled_mm`` runs."""
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"linear = {validate.describe(linear)}: expected an nn.Linear")
        rec = recipe_of(recipe, block=block)
        if rec.scaling == "blockwise":
            for name, dim in (
                ("in_features", linear.in_features),
                ("out_features", linear.out_features),
            ):
                if dim % rec.block:
                    raise ValueError(
                        f"{name} = {dim}: expected a multiple of block = {rec.block} for "
                        "blockwise scaling (skip this layer or choose a smaller block)"
                    )
        return cls(linear.weight, linear.bias, rec, bool(emulate))

    def _cast(self, t: torch.Tensor, role: str, dtype: str, *, record: bool = False) -> Float8Data:
        rec = self.recipe
        block: int | tuple[int, int] = (rec.block, rec.block) if role == "weight" else rec.block
        if not rec.scaled:  # saturates above 448 (57,344), flushes below 2^-9 (2^-16) to 0
            return to_float8(t, dtype=dtype, scale=1.0)
        if not rec.delayed:
            return to_float8(
                t, dtype=dtype, scaling=rec.scaling, block=block, power_of_2=rec.power_of_2
            )
        _check_input(t)  # before the history records an inf amax
        amax = float(t.detach().abs().amax()) if t.numel() else 0.0  # empty: nothing to scale
        hist = self.amax_history[role]
        scale = (max(hist) if hist else amax) / fp8_max(dtype)  # the past decides the scale
        if record:
            self.saturated[role] = int((t.detach().abs() > scale * fp8_max(dtype)).sum())
            hist.append(amax)
            del hist[: -rec.history]
        return to_float8(t, dtype=dtype, scale=max(scale, 1e-12 / fp8_max(dtype)))

    def _mm(self, a: Float8Data, b: Float8Data) -> torch.Tensor:
        out, self.gemm = fp8_matmul(a, b, out_dtype=torch.float32, emulate=self.emulate)
        return out

    def check_input(self, x: object) -> torch.Tensor:
        """Refuse an input the layer cannot take: a floating-point tensor (..., in_features)."""
        k = self.in_features
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"x = {validate.describe(x)}: expected a tensor (..., {k})")
        if x.dim() == 0 or x.shape[-1] != k:
            got = "none" if x.dim() == 0 else x.shape[-1]
            raise ValueError(
                f"x.shape = {tuple(x.shape)}: expected (..., {k}), a last dimension of "
                f"in_features = {k} (got {got})"
            )
        if not x.dtype.is_floating_point:
            raise TypeError(f"x.dtype = {x.dtype}: expected a floating-point dtype")
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = as_2d(self.check_input(x))  # (M, K), M = every leading dim (0 rows: empty)
        fn: type[torch.autograd.Function] = _Float8Matmul  # torch leaves Function.apply untyped
        y2 = cast(torch.Tensor, fn.apply(x2, self.weight, self))
        y = y2.reshape(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"recipe={self.recipe.name!r}, bias={self.bias is not None}"
        )


def float8_layers(model: nn.Module) -> dict[str, Float8Linear]:
    """``{name: layer}`` of the model's :class:`Float8Linear` layers."""
    return {n: m for n, m in model.named_modules() if isinstance(m, Float8Linear)}


def convert_to_float8(
    model: nn.Module,
    *,
    recipe: str | Float8Recipe = "tensorwise",
    skip: Iterable[str] = ("lm_head",),
    block: int | None = None,
    emulate: bool = False,
) -> nn.Module:
    """Replace, in place, every ``nn.Linear`` of ``model`` whose name (or last component) is not
    in ``skip`` by a :class:`Float8Linear` sharing its parameters; returns ``model``. The output
    head is skipped by default (DeepSeek-V3 and torchtitan keep it in higher precision)."""
    skip = [skip] if isinstance(skip, str) else list(skip)
    names = [
        n
        for n, m in model.named_modules()
        if isinstance(m, nn.Linear) and not any(n == s or n.endswith("." + s) for s in skip)
    ]
    if not names:
        raise ValueError(
            f"skip = {skip!r}: no nn.Linear of {type(model).__name__} is left to convert"
        )
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        layer = Float8Linear.from_linear(
            getattr(parent, child), recipe=recipe, block=block, emulate=emulate
        )
        setattr(parent, child, layer)
    return model
