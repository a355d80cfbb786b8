"""FP8 training formulas: the formats, bytes of a scaled cast, FP8 all-gather bytes and memory
under FSDP, and how much of a step FP8 can speed up.

Introduced in notebooks/17_fp8_training.ipynb. Sources: Micikevicius et al. 2022, "FP8 formats
for deep learning" (arXiv:2209.05433, Table 1); DeepSeek-AI 2024, DeepSeek-V3 technical report
(arXiv:2412.19437, Sec. 3.3: 1 x 128 activation tiles, 128 x 128 weight blocks, FP8 dispatch);
NVIDIA H100 SXM datasheet (989 TFLOP/s dense BF16, 1,979 dense FP8; the doubled figures it
prints are with 2:4 sparsity). Speeds here are the datasheet's peaks and an Amdahl model, never
a measurement.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

from course_lib import validate as _v
from course_lib.measure.estimate.memory import dtype_bytes
from course_lib.measure.estimate.units import exact

__all__ = [
    "Fp8Format",
    "FP8_FORMATS",
    "fp8_format",
    "Fp8Scaling",
    "FP8_SCALINGS",
    "fp8_scale_count",
    "fp8_cast_bytes",
    "Gather",
    "GATHER_DTYPE_BYTES",
    "fsdp_allgather_bytes_sent",
    "fsdp_fp8_memory_per_gpu",
    "H100_PEAK_FLOPS",
    "linear_flops_fraction",
    "fp8_step_speedup",
]


@dataclass(frozen=True)
class Fp8Format:
    """One FP8 format as Micikevicius et al. 2022 define it (Table 1)."""

    name: str
    exponent_bits: int
    mantissa_bits: int
    max_normal: float
    min_normal: float
    min_subnormal: float
    source: str

    @property
    def epsilon(self) -> float:
        """Gap between 1 and the next value: 2**-mantissa_bits."""
        return 2.0**-self.mantissa_bits


_TABLE1 = "Micikevicius et al. 2022 (arXiv:2209.05433), Table 1"
FP8_FORMATS: dict[str, Fp8Format] = {
    "e4m3": Fp8Format("e4m3", 4, 3, 448.0, 2.0**-6, 2.0**-9, _TABLE1 + ": no infinities, one NaN"),
    "e5m2": Fp8Format("e5m2", 5, 2, 57344.0, 2.0**-14, 2.0**-16, _TABLE1 + ": IEEE-like, inf"),
}


def fp8_format(name: str) -> Fp8Format:
    """An :data:`FP8_FORMATS` entry by name ("e4m3" or "e5m2")."""
    return FP8_FORMATS[_v.choice("name", name, FP8_FORMATS)]


Fp8Scaling = Literal["tensorwise", "rowwise", "blockwise"]
FP8_SCALINGS: tuple[Fp8Scaling, ...] = ("tensorwise", "rowwise", "blockwise")


def fp8_scale_count(
    rows: int, cols: int, *, scaling: Fp8Scaling, block: int = 128, block_rows: int = 1
) -> int:
    """Scales of a (rows, cols) FP8 cast: 1 (tensorwise), ``rows`` (rowwise: one per row, the
    contraction dimension along ``cols``), or (rows / block_rows) x (cols / block) (blockwise;
    DeepSeek-V3: block_rows 1 for activations, 128 for weights). Blocks must divide."""
    r, c = _v.count("rows", rows, minimum=1), _v.count("cols", cols, minimum=1)
    scaling = _v.choice("scaling", scaling, FP8_SCALINGS)
    if scaling == "tensorwise":
        return 1
    if scaling == "rowwise":
        return r
    b, br = _v.count("block", block, minimum=1), _v.count("block_rows", block_rows, minimum=1)
    if c % b or r % br:
        raise ValueError(
            f"block = {b}, block_rows = {br}: expected them to divide cols = {c} and rows = {r}"
        )
    return (r // br) * (c // b)


def fp8_cast_bytes(
    rows: int,
    cols: int,
    *,
    scaling: Fp8Scaling,
    block: int = 128,
    block_rows: int = 1,
    scale_bytes: int = 4,
) -> int:
    """Bytes of an FP8 cast of a (rows, cols) tensor: 1 per value plus ``scale_bytes`` (fp32: 4)
    per scale (:func:`fp8_scale_count`)."""
    n = fp8_scale_count(rows, cols, scaling=scaling, block=block, block_rows=block_rows)
    return rows * cols + _v.count("scale_bytes", scale_bytes, minimum=1) * n


Gather = Literal["fp32", "bf16", "fp8"]
#: bytes per parameter an all-gather carries for the linear layers' weights (``dtype_bytes``)
GATHER_DTYPE_BYTES: dict[str, int] = {g: dtype_bytes(g) for g in ("fp32", "bf16", "fp8")}


def fsdp_allgather_bytes_sent(
    *,
    linear_params: int,
    other_params: int,
    world_size: int,
    gather: Gather = "fp8",
    other_dtype_bytes: int = 2,
    reshard_after_forward: bool = True,
) -> int | float:
    """Bytes each rank sends in one step's parameter all-gathers under FSDP / ZeRO-3 (ring):
    passes x (N-1)/N x (linear_params x w + other_params x o), with w the gathered width of the
    linear layers' weights (fp32 4, bf16 2, fp8 1: :data:`GATHER_DTYPE_BYTES`) and o that of every
    other parameter (``other_dtype_bytes``; the same as w under "fp32" and "bf16"). passes = 2
    (before forward and again before backward) or 1 without resharding. Counts are the padded
    sizes the all-gathers really carry. The amax all-reduce of FP8 (4 B per layer) is not in it.
    int when exact, else float."""
    n = _v.count("world_size", world_size, minimum=1)
    lin, oth = _v.count("linear_params", linear_params), _v.count("other_params", other_params)
    w = GATHER_DTYPE_BYTES[_v.choice("gather", gather, GATHER_DTYPE_BYTES)]
    o = w if gather != "fp8" else _v.count("other_dtype_bytes", other_dtype_bytes, minimum=1)
    passes = 2 if _v.choice("reshard_after_forward", reshard_after_forward, (True, False)) else 1
    return exact(Fraction(passes * (n - 1) * (lin * w + oth * o), n))


def fsdp_fp8_memory_per_gpu(
    n_params: int,
    world_size: int,
    *,
    largest_layer_params: int,
    master_bytes: int = 4,
    grad_bytes: int = 4,
    state_bytes: int = 8,
    gather: Gather = "fp8",
) -> dict[str, int | float]:
    """Model-state bytes per GPU of an FSDP step with an FP8 all-gather: the fp32 master shard,
    its gradient shard and Adam's two moments, each / N (``sharded``), plus the largest layer's
    gathered weights while it computes (``gathered``: 1 B/param in FP8, 2 in bf16, 4 in fp32).
    Activations are not in it. Returns ``{"sharded", "gathered", "total"}`` (int when exact)."""
    p, n = _v.count("n_params", n_params, minimum=1), _v.count("world_size", world_size, minimum=1)
    big = _v.count("largest_layer_params", largest_layer_params, minimum=1)
    per = sum(
        _v.count(k, v, minimum=0)
        for k, v in (
            ("master_bytes", master_bytes),
            ("grad_bytes", grad_bytes),
            ("state_bytes", state_bytes),
        )
    )
    sharded = exact(Fraction(p * per, n))
    gathered = big * GATHER_DTYPE_BYTES[_v.choice("gather", gather, GATHER_DTYPE_BYTES)]
    return {"sharded": sharded, "gathered": gathered, "total": exact(Fraction(sharded) + gathered)}


#: dense tensor-core peaks of one H100 SXM in FLOP/s (NVIDIA datasheet; no sparsity)
H100_PEAK_FLOPS: dict[str, float] = {"bf16": 989e12, "fp8": 1979e12}


def linear_flops_fraction(
    *,
    layers: int,
    hidden: int,
    seq: int,
    ffn: int,
    heads: int,
    kv_heads: int | None = None,
    gated_mlp: bool = True,
    vocab: int = 0,
) -> float:
    """Share of a dense decoder's training FLOPs in the layers' linear matmuls, the GEMMs FP8
    recipes convert. Per token and layer: linear 6 x (2h^2 + 2hk + (3 or 2) h f) with k the K/V
    width; attention scores and values 6 x 2 s h (QK^T and AV, forward 4sh, backward twice that;
    full, not halved for the causal mask); the output head 6 h V (kept in high precision)."""
    L, h = _v.count("layers", layers, minimum=1), _v.count("hidden", hidden, minimum=1)
    s, f = _v.count("seq", seq, minimum=1), _v.count("ffn", ffn, minimum=1)
    a = _v.count("heads", heads, minimum=1)
    g = a if kv_heads is None else _v.count("kv_heads", kv_heads, minimum=1, maximum=a)
    k = g * h // a
    linear = 6 * (2 * h * h + 2 * h * k + (3 if gated_mlp else 2) * h * f)
    attention = 12 * s * h
    head = 6 * h * _v.count("vocab", vocab)
    return L * linear / (L * (linear + attention) + head)


def fp8_step_speedup(
    fraction: float, *, matmul_speedup: float = 2.0, overhead: float = 0.0
) -> float:
    """Amdahl's law for FP8: a step whose ``fraction`` of time runs in GEMMs that FP8 makes
    ``matmul_speedup`` x faster (2 at the H100's peaks), plus ``overhead`` (amax and casts, as a
    share of the original step): 1 / ((1 - fraction) + fraction / matmul_speedup + overhead)."""
    f = _v.number("fraction", fraction, minimum=0.0, maximum=1.0)
    s = _v.number("matmul_speedup", matmul_speedup, positive=True)
    o = _v.number("overhead", overhead, minimum=0.0)
    return 1.0 / ((1.0 - f) + f / s + o)
