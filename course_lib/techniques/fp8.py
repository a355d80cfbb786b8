"""FP8 casts with a scale, and the scaled matmul that consumes them.

Micikevicius et al. 2022, "FP8 formats for deep learning" (arXiv:2209.05433), Table 1: E4M3
(max 448, no infinities: PyTorch's ``float8_e4m3fn``, "fn" = finite, NaN only) for weights and
activations, E5M2 (max 57,344, IEEE-like with inf) for gradients. Eight bits cannot cover a
tensor's range on their own, so every cast carries a **scale**: ``x ~ data * scale`` with
``scale = amax / fp8_max``, so that the largest |value| lands on the format's largest number.

One scale per what? (``scaling``):

* ``"tensorwise"``: one scale for the whole tensor (torchao's default recipe). One outlier sets
  ``amax`` for everyone: the rest is pushed into the coarse bottom of the format.
* ``"rowwise"``: one scale per row, along the matmul's contraction dimension (torchao's
  "rowwise"/axiswise recipe: ``x`` (M, K) gets M scales, a weight (N, K) N scales).
* ``"blockwise"``: one scale per ``block`` of ``(rows, cols)`` elements; an int ``b`` means
  ``(1, b)`` tiles. DeepSeek-V3 (arXiv:2412.19437, Sec. 3.3.2): 1 x 128 tiles for activations,
  128 x 128 blocks for weights.

Convention: ``scale`` is the *dequantisation* factor (``data.float() * scale`` gives ``x`` back),
the one ``torch._scaled_mm`` takes as ``scale_a``/``scale_b``; torchao stores its reciprocal.
Values beyond ``fp8_max * scale`` (possible when a scale is given, as delayed scaling does)
**saturate** to +-fp8_max: clamped before the cast, as torchao does, whatever the cast itself
would do. An ``amax`` of 0 (an all-zero row) gives a tiny scale, never 0 (0 stays 0).
An empty tensor casts to an empty one (the scale of a tensorwise cast is still one number, the
tiny one; one per row under rowwise, none where there is no block), and a product with an
empty operand is the (M, N) of zeros it means.

:func:`fp8_matmul` computes ``a @ b.T`` from two casts. Where ``torch._scaled_mm`` runs (CPU
in torch 2.13, H100 on CUDA) and the scales are one per tensor or one per row, it is used;
blockwise scales have no ``_scaled_mm`` kernel here, so they are **emulated**: the FP8 operands
are dequantised and multiplied in fp32 (what DeepSeek-V3's kernels compute by accumulating
each 128-wide K slice in fp32 and multiplying by its scales, up to the order of the sums).

The layer that uses them, ``Float8Linear`` (with ``Float8Recipe``, ``RECIPES``,
``convert_to_float8``, ``float8_layers``), lives in ``fp8_linear.py``, which builds on
this module (never the other way round).

Introduced in notebooks/17_fp8_training.ipynb.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

from course_lib import validate

__all__ = [
    "FORMATS",
    "Scaling",
    "SCALINGS",
    "Float8Data",
    "fp8_dtype",
    "fp8_max",
    "to_float8",
    "fp8_matmul",
    "scaled_mm_available",
    "relative_error",
]

#: the two FP8 formats by the course's short names (Micikevicius et al. 2022, Table 1)
FORMATS: dict[str, torch.dtype] = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
Scaling = Literal["tensorwise", "rowwise", "blockwise"]
SCALINGS: tuple[Scaling, ...] = ("tensorwise", "rowwise", "blockwise")
_TINY_AMAX = 1e-12  # torchao's EPS: an all-zero block gets a scale of 1e-12 / max, not 0


def fp8_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """``"e4m3"``/``"e5m2"`` or the torch dtype itself -> the torch dtype."""
    if isinstance(dtype, torch.dtype) and dtype in FORMATS.values():
        return dtype
    return FORMATS[validate.choice("dtype", dtype, FORMATS)]


def fp8_max(dtype: str | torch.dtype) -> float:
    """Largest finite value of the format: 448 (E4M3) or 57,344 (E5M2)."""
    return float(torch.finfo(fp8_dtype(dtype)).max)


@dataclass(frozen=True)
class Float8Data:
    """An FP8 cast: ``data`` (FP8, the shape of the input) and ``scale`` (fp32, one per block of
    ``block`` = (rows, cols) of the input seen as 2-D (-1, last dim)), ``x ~ data * scale``."""

    data: torch.Tensor
    """the FP8 values, shape of the input"""
    scale: torch.Tensor
    """fp32 dequantisation factors, (rows / block[0], cols / block[1]); 1 along a dimension
    that one block spans whole when it is empty (a tensorwise scale is always (1, 1))"""
    block: tuple[int, int]
    """rows and columns of the 2-D view that share one scale"""
    scaling: Scaling
    """how ``block`` was chosen"""

    def expanded_scale(self) -> torch.Tensor:
        """The scale repeated over its block: (rows, cols) of the 2-D view."""
        br, bc = self.block
        return self.scale.repeat_interleave(br, dim=0).repeat_interleave(bc, dim=1)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """``data * scale`` in ``dtype``, the input's shape."""
        d2 = as_2d(self.data).float()  # (R, C)
        return (d2 * self.expanded_scale()).reshape(self.data.shape).to(dtype)

    def nbytes(self) -> int:
        """Bytes stored: one per FP8 value, four per fp32 scale."""
        return self.data.numel() * self.data.element_size() + 4 * self.scale.numel()


def as_2d(x: torch.Tensor) -> torch.Tensor:
    """``x`` seen as (rows, last dim), every leading dimension folded into the rows (also when
    a dimension is 0, where ``reshape(-1, c)`` cannot tell the rows)."""
    return x.reshape(math.prod(x.shape[:-1]), x.shape[-1])


def _grid(x2: torch.Tensor, br: int, bc: int) -> tuple[int, int]:
    """Scales along the rows and the columns: one per block; one where the block is a whole
    empty dimension (tensorwise of 0 rows, rowwise of 0 columns)."""
    rows, cols = x2.shape
    return (rows // br if br else 1), (cols // bc if bc else 1)


def _block_shape(x2: torch.Tensor, scaling: str, block: int | tuple[int, int]) -> tuple[int, int]:
    rows, cols = x2.shape
    if scaling == "tensorwise":
        return rows, cols
    if scaling == "rowwise":
        return 1, cols
    br, bc = (1, block) if isinstance(block, int) else tuple(block)
    br = validate.count("block[0]", br, minimum=1)
    bc = validate.count("block", bc, minimum=1)
    if cols % bc or rows % br:
        raise ValueError(
            f"block = {(br, bc)}: expected it to divide the 2-D view {tuple(x2.shape)} of x "
            f"(rows % {br} and last dim % {bc} must be 0)"
        )
    return br, bc


def _check_input(x: torch.Tensor) -> None:
    if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.dim() == 0:
        raise TypeError(f"x = {validate.describe(x)}: expected a floating-point tensor, >= 1-D")
    if x.numel() and not bool(torch.isfinite(x).all()):
        raise ValueError(
            "x = a tensor with inf or NaN: expected finite values (a scale computed from an inf "
            "amax would flush every other value to 0)"
        )


def _block_amax(x2: torch.Tensor, br: int, bc: int) -> torch.Tensor:
    rows, cols = x2.shape
    if x2.numel() == 0:  # no values: amax 0 (the tiny scale), one per block of the grid
        return torch.zeros(_grid(x2, br, bc), device=x2.device)
    tiles = x2.abs().reshape(rows // br, br, cols // bc, bc)  # (R/br, br, C/bc, bc)
    return tiles.amax(dim=(1, 3)).float()  # (R/br, C/bc)


def to_float8(
    x: torch.Tensor,
    *,
    dtype: str | torch.dtype = "e4m3",
    scaling: Scaling = "tensorwise",
    block: int | tuple[int, int] = 128,
    scale: torch.Tensor | float | None = None,
    power_of_2: bool = False,
) -> Float8Data:
    """Cast ``x`` to FP8 with one scale per ``scaling`` group (module doc).

    ``scale``: use these dequantisation factors instead of ``amax / fp8_max`` (delayed scaling
    passes the one from its amax history; a scalar or a tensor of the scale's shape); values
    beyond ``fp8_max * scale`` saturate. ``power_of_2``: round each scale *up* to a power of two
    (torchao's rowwise recipe rounds its reciprocal down), so rescaling is exact in binary.
    """
    _check_input(x)
    scaling = validate.choice("scaling", scaling, SCALINGS)
    fmt = fp8_dtype(dtype)
    top = fp8_max(fmt)
    x2 = as_2d(x.detach()).float()  # (R, C)
    br, bc = _block_shape(x2, scaling, block)
    if scale is None:
        s = _block_amax(x2, br, bc).clamp_min(_TINY_AMAX) / top  # (R/br, C/bc)
    else:
        s = torch.as_tensor(scale, dtype=torch.float32, device=x2.device).expand(_grid(x2, br, bc))
        if not bool(torch.isfinite(s).all()) or bool((s <= 0).any()):
            raise ValueError(
                f"scale = {validate.describe(scale)}: expected finite values > 0 (a scale of 0 "
                "divides by zero)"
            )
    if power_of_2:
        s = torch.exp2(torch.ceil(torch.log2(s)))
    full = s.repeat_interleave(br, dim=0).repeat_interleave(bc, dim=1)  # (R, C)
    data = (x2 / full).clamp(-top, top).to(fmt).reshape(x.shape)
    return Float8Data(data, s.contiguous(), (br, bc), scaling)


def scaled_mm_available(
    device: torch.device | str = "cpu", scaling: Literal["tensorwise", "rowwise"] = "tensorwise"
) -> bool:
    """Whether ``torch._scaled_mm`` runs a small E4M3 product on ``device`` with ``scaling``'s
    scales, at a usable speed (checked once per device and scaling). torch 2.11's CPU kernel
    takes one scale per tensor only; 2.13's takes one per row too. On some CPUs (seen on one
    with AVX-512, torch 2.13) the tensorwise kernel takes a slow path: 0.9 s for a 256 x 512 x
    384 product that rowwise does in 14 ms. There the product is emulated instead (the
    dequantised fp32 product, what the kernel computes up to the order of its sums)."""
    key = (str(torch.device(device)), scaling)
    if key not in _SCALED_MM:
        try:
            _SCALED_MM[key] = _kernel_runs(torch.device(device), scaling)
        except (RuntimeError, NotImplementedError, AttributeError):
            _SCALED_MM[key] = False
    return _SCALED_MM[key]


def _kernel_runs(device: torch.device, scaling: str) -> bool:
    """The kernel runs a product; on a CPU, also within 30 times an fp32 matmul of its size.

    Both are timed more than once, because on a busy machine one timing of either can be tens
    of times its quiet value: the fp32 product's fastest of five is the yardstick (a noisy,
    slow one made a slow kernel look usable), and the kernel passes once one of up to three
    runs is within the bound."""
    import time

    m, k = (128, 256) if device.type == "cpu" else (16, 16)
    a = torch.ones(m, k, device=device).to(torch.float8_e4m3fn)
    n = m if scaling == "rowwise" else 1
    sa, sb = torch.ones(n, 1, device=device), torch.ones(1, n, device=device)
    if scaling == "tensorwise":
        sa, sb = sa.reshape(()), sb.reshape(())
    torch._scaled_mm(a, a.t(), scale_a=sa, scale_b=sb, out_dtype=torch.float32)
    if device.type != "cpu":
        return True
    x = torch.ones(m, k, device=device)
    x @ x.t()  # warm
    fp32 = []
    for _ in range(5):
        start = time.perf_counter()
        x @ x.t()
        fp32.append(time.perf_counter() - start)
    bound = max(30 * min(fp32), 5e-3)
    for _ in range(3):
        start = time.perf_counter()
        torch._scaled_mm(a, a.t(), scale_a=sa, scale_b=sb, out_dtype=torch.float32)
        if time.perf_counter() - start < bound:
            return True
    return False


_SCALED_MM: dict[tuple[str, str], bool] = {}


def _scaled_mm_scales(a: Float8Data, b: Float8Data) -> tuple[torch.Tensor, torch.Tensor] | None:
    """_scaled_mm's (scale_a, scale_b) when the scales are one per tensor or one per row."""
    if a.scaling == b.scaling == "tensorwise":
        return a.scale.reshape(()), b.scale.reshape(())
    if a.scaling == b.scaling == "rowwise":
        return a.scale.reshape(-1, 1), b.scale.reshape(1, -1)  # (M, 1), (1, N)
    return None


def fp8_matmul(
    a: Float8Data,
    b: Float8Data,
    *,
    out_dtype: torch.dtype = torch.float32,
    emulate: bool | None = None,
) -> tuple[torch.Tensor, str]:
    """``a @ b.T`` for a (M, K) and b (N, K), both scaled along K -> ((M, N), how).

        ``how`` is ``"_scaled_mm"`` (torch's FP8 kernel) or ``"emulated"`` (dequantise to fp32,
        multiply in fp32: blockwise scales, or ``emulate=True``, or no kernel on this device, or an
    empty operand, which gives the (M, N) zeros of an empty sum).
    """
    if a.data.dim() != 2 or b.data.dim() != 2 or a.data.shape[1] != b.data.shape[1]:
        raise ValueError(
            f"a, b shapes = {tuple(a.data.shape)}, {tuple(b.data.shape)}: expected (M, K) and "
            "(N, K) with the same K"
        )
    scales = _scaled_mm_scales(a, b)
    empty = a.data.numel() == 0 or b.data.numel() == 0  # (M, N) zeros: no kernel needed
    kernel = (
        not empty
        and scales is not None
        and scaled_mm_available(
            a.data.device, "rowwise" if a.scaling == "rowwise" else "tensorwise"
        )
    )
    if kernel and not emulate and scales is not None:
        out = torch._scaled_mm(
            a.data, b.data.t(), scale_a=scales[0], scale_b=scales[1], out_dtype=out_dtype
        )  # (M, N); b.data.t() is column-major, as the kernel wants
        return out, "_scaled_mm"
    return (a.dequantize() @ b.dequantize().t()).to(out_dtype), "emulated"


def relative_error(approx: torch.Tensor, exact: torch.Tensor) -> float:
    """||approx - exact|| / ||exact|| (Frobenius), in fp64; 0 when both are 0."""
    e, a = exact.detach().double(), approx.detach().double()
    norm = float(e.norm())
    return float((a - e).norm()) / norm if norm else float((a - e).norm())
