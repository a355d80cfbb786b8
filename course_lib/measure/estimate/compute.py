"""Compute: FLOPs, arithmetic intensity, the roofline, training FLOPs, the pipeline bubble.

Introduced in notebooks/02_batch_size_and_accumulation.ipynb."""

from __future__ import annotations

from typing import Literal, NamedTuple

from course_lib import validate as _v

__all__ = [
    "pipeline_bubble_fraction",
    "pipeline_bubble_ratio",
    "microbatches_for_bubble",
    "pipeline_boundary_bytes",
    "pipeline_messages",
    "matmul_flops",
    "matmul_bytes",
    "ELEMENTWISE_FLOPS",
    "ElementwiseCost",
    "elementwise_cost",
    "arithmetic_intensity",
    "matmul_arithmetic_intensity",
    "ridge_point",
    "attainable_flops",
    "roofline_time",
    "GemmCalibration",
    "GEMM_CALIBRATIONS",
    "calibrate_gemm",
    "gemm_time",
    "gemm_efficiency",
]


def pipeline_bubble_fraction(stages: int, microbatches: int, virtual_stages: int = 1) -> float:
    """Idle fraction of a GPipe / 1F1B pipeline step, idle time over the whole step:
    (p-1)/(v·m + p-1) (Huang et al. 2019, GPipe, arXiv:1811.06965; with v stages per rank,
    interleaved 1F1B, Narayanan et al. 2021, arXiv:2104.04473 Sec. 2.2.2). Narayanan et al. write
    the bubble over the *ideal* (bubble-free) time instead, :func:`pipeline_bubble_ratio`
    (p-1)/(v·m): the same bubble, another denominator. Introduced in
    notebooks/12_pipeline_parallelism.ipynb."""
    p, m = _v.count("stages", stages, minimum=1), _v.count("microbatches", microbatches, minimum=1)
    v = _v.count("virtual_stages", virtual_stages, minimum=1)
    return (p - 1) / (v * m + p - 1)


def pipeline_bubble_ratio(stages: int, microbatches: int, virtual_stages: int = 1) -> float:
    """Bubble time over ideal time, (p-1)/(v·m) (Narayanan et al. 2021, arXiv:2104.04473 Sec.
    2.2.1-2.2.2). It exceeds :func:`pipeline_bubble_fraction` (idle over total) and can exceed 1;
    the two are related by fraction = ratio / (1 + ratio)."""
    p, m = _v.count("stages", stages, minimum=1), _v.count("microbatches", microbatches, minimum=1)
    v = _v.count("virtual_stages", virtual_stages, minimum=1)
    return (p - 1) / (v * m)


def microbatches_for_bubble(
    stages: int,
    target: float,
    *,
    definition: Literal["fraction", "ratio"] = "fraction",
    virtual_stages: int = 1,
) -> int:
    """The smallest m whose bubble is below ``target`` (strictly), by ``definition``
    "fraction" ((p-1)/(v·m+p-1), :func:`pipeline_bubble_fraction`) or "ratio" ((p-1)/(v·m),
    :func:`pipeline_bubble_ratio`). At p = 4, target 0.1: 28 by fraction, 31 by ratio."""
    p = _v.count("stages", stages, minimum=1)
    target = _v.number("target", target, positive=True)
    definition = _v.choice("definition", definition, ("fraction", "ratio"))
    fn = pipeline_bubble_fraction if definition == "fraction" else pipeline_bubble_ratio
    m = 1
    while fn(p, m, virtual_stages) >= target:
        m += 1
    return m


def pipeline_boundary_bytes(batch: int, seq: int, hidden: int, *, dtype_bytes: int = 2) -> int:
    """Bytes of the activation that crosses one stage boundary for one micro-batch, each way
    (the activation forward, its gradient backward): b·s·h·dtype_bytes, 2bsh in bf16 (32 MiB
    at b 2, s 2048, h 4096). Introduced in notebooks/12_pipeline_parallelism.ipynb."""
    return (
        _v.count("batch", batch, minimum=1)
        * _v.count("seq", seq, minimum=1)
        * _v.count("hidden", hidden, minimum=1)
        * _v.count("dtype_bytes", dtype_bytes, minimum=1)
    )


def pipeline_messages(stages: int, microbatches: int, virtual_stages: int = 1) -> int:
    """Point-to-point messages of one pipeline step over all ranks: each of m micro-batches
    crosses v·p-1 stage boundaries forward and again backward, 2·m·(v·p-1); interleaving
    multiplies the boundaries (and the bytes) by about v."""
    p, m = _v.count("stages", stages, minimum=1), _v.count("microbatches", microbatches, minimum=1)
    v = _v.count("virtual_stages", virtual_stages, minimum=1)
    return 2 * m * (v * p - 1)


# --------------------------------------------------------------------------------------------
# FLOPs and roofline
# --------------------------------------------------------------------------------------------
def matmul_flops(m: int, n: int, k: int) -> int:
    """FLOPs of an (m x k) @ (k x n) matmul: 2mnk (one multiply and one add per term)."""
    return 2 * _v.count("m", m) * _v.count("n", n) * _v.count("k", k)


def matmul_bytes(m: int, n: int, k: int, *, dtype_bytes: int = 4) -> int:
    """Bytes an (m x k) @ (k x n) matmul moves to and from memory if it reads A and B once and
    writes C once: (mk + kn + mn) * dtype_bytes -- the minimum traffic, reached when the
    operands fit in cache (Williams, Waterman & Patterson 2009, "Roofline", CACM 52(4)).
    Introduced in notebooks/02_batch_size_and_accumulation.ipynb."""
    m, n, k = _v.count("m", m), _v.count("n", n), _v.count("k", k)
    return _v.count("dtype_bytes", dtype_bytes, minimum=1) * (m * k + k * n + m * n)


#: FLOPs per element of the elementwise operations the roofline of unit 02 places, counted from
#: their formulas: GELU (erf form, torch.nn.functional.gelu) x * 0.5 * (1 + erf(x / sqrt 2)):
#: ~8 (erf itself is a short polynomial); LayerNorm: mean 1, variance 3, normalize 2, scale and
#: shift 2 = 8.
ELEMENTWISE_FLOPS = {"gelu": 8, "layernorm": 8}


class ElementwiseCost(NamedTuple):
    """Work and traffic of an elementwise operation: ``flops`` (FLOPs) and ``bytes`` (bytes)."""

    flops: int | float
    bytes: int


def elementwise_cost(
    numel: int, *, flops_per_element: float | str, dtype_bytes: int = 4
) -> ElementwiseCost:
    """FLOPs and bytes of an elementwise op over ``numel`` elements that reads its input once and
    writes its output once: ``flops = flops_per_element * numel``, ``bytes = 2 * numel *
    dtype_bytes`` (small operands such as LayerNorm's weight and bias are not counted).

    ``flops_per_element``: a number, or the name of an op in :data:`ELEMENTWISE_FLOPS`
    ("gelu", "layernorm"). Returns an :class:`ElementwiseCost` ``(flops, bytes)``; flops is an
    int when it is whole. Roofline accounting of Williams, Waterman & Patterson 2009.
    Introduced in notebooks/02_batch_size_and_accumulation.ipynb.
    """
    n = _v.count("numel", numel)
    per: float
    if isinstance(flops_per_element, str):
        per = ELEMENTWISE_FLOPS[
            _v.choice(
                "flops_per_element", flops_per_element, ELEMENTWISE_FLOPS, case_insensitive=True
            )
        ]
    else:
        per = _v.number("flops_per_element", flops_per_element, minimum=0)
    flops: int | float = per * n
    if isinstance(flops, float) and flops.is_integer():
        flops = int(flops)
    return ElementwiseCost(flops, 2 * n * _v.count("dtype_bytes", dtype_bytes, minimum=1))


def arithmetic_intensity(flops: float, bytes_moved: float) -> float:
    """FLOPs per byte moved to/from memory (Williams, Waterman & Patterson 2009, "Roofline")."""
    return _v.number("flops", flops, minimum=0) / _v.number(
        "bytes_moved", bytes_moved, positive=True
    )


def matmul_arithmetic_intensity(m: int, n: int, k: int, *, dtype_bytes: int = 4) -> float:
    """Arithmetic intensity of an (m x k) @ (k x n) matmul that reads A and B once and writes C
    once: 2mnk / (dtype_bytes (mk + kn + mn)) FLOPs/byte (:func:`matmul_flops` over
    :func:`matmul_bytes`)."""
    return arithmetic_intensity(
        matmul_flops(m, n, k), matmul_bytes(m, n, k, dtype_bytes=dtype_bytes)
    )


def ridge_point(peak_flops: float, mem_bandwidth: float) -> float:
    """Intensity (FLOPs/byte) where a kernel turns from memory-bound to compute-bound:
    peak FLOP/s / memory bandwidth (bytes/s)."""
    return _v.number("peak_flops", peak_flops, positive=True) / _v.number(
        "mem_bandwidth", mem_bandwidth, positive=True
    )


def attainable_flops(intensity: float, peak_flops: float, mem_bandwidth: float) -> float:
    """Roofline: attainable FLOP/s = min(peak, intensity x bandwidth)."""
    return min(
        _v.number("peak_flops", peak_flops, positive=True),
        _v.number("intensity", intensity, minimum=0)
        * _v.number("mem_bandwidth", mem_bandwidth, positive=True),
    )


def roofline_time(
    flops: float, bytes_moved: float, peak_flops: float, mem_bandwidth: float
) -> float:
    """Lower bound on a kernel's time in s: max(flops / peak, bytes / bandwidth)."""
    return max(
        _v.number("flops", flops, minimum=0) / _v.number("peak_flops", peak_flops, positive=True),
        _v.number("bytes_moved", bytes_moved, minimum=0)
        / _v.number("mem_bandwidth", mem_bandwidth, positive=True),
    )


# --------------------------------------------------------------------------------------------
# One GEMM's time from its shape
# --------------------------------------------------------------------------------------------
class GemmCalibration(NamedTuple):
    """What one card's GEMMs reach: ``peak_flops`` (the data sheet's dense peak of the dtype,
    FLOP/s), ``mem_bandwidth`` (HBM, bytes/s), ``ceiling`` (the fraction of the peak a full
    wave of output tiles sustains), ``sms`` (streaming multiprocessors: one output tile each
    per wave; 0 leaves waves out), ``tile`` (rows x columns of one output tile), and
    ``fixed_s`` (seconds each product costs besides, 0 by default), and where the figures come
    from."""

    peak_flops: float
    mem_bandwidth: float
    ceiling: float
    sms: int = 0
    tile: tuple[int, int] = (128, 256)
    fixed_s: float = 0.0
    source: str = ""


def _waves(m: int, n: int, batch: int, c: GemmCalibration) -> tuple[int, float]:
    """(waves of output tiles, useful fraction of the tiles' area) of ``batch`` m x n outputs."""
    tm, tn = c.tile
    tiles = batch * -(-m // tm) * -(-n // tn)
    waves = -(-tiles // c.sms) if c.sms else 1
    area = waves * (c.sms or tiles) * tm * tn
    return waves, batch * m * n / area


def gemm_time(
    m: int,
    n: int,
    k: int,
    calibration: GemmCalibration,
    *,
    batch: int = 1,
    dtype_bytes: int = 2,
    extra_bytes: float = 0,
) -> float:
    """Seconds of ``batch`` (m x k) @ (k x n) products on a card of ``calibration``: the
    roofline's two bounds, max(compute, bytes / bandwidth), plus ``fixed_s``. Compute: the
    output is cut in tiles, one per SM at a time; each wave of tiles takes a full tile's FLOPs
    (2 x tile area x k) at ``ceiling`` x the peak shared by the SMs, so a product whose tiles
    leave SMs idle or a tile half empty reaches less of the peak: the achievable fraction grows
    with the size (Volkov's wave quantization; NVIDIA's "Matrix Multiplication Background
    User's Guide" names the tile and wave effects). Bytes: batch (m k + k n + m n) dtype_bytes
    + ``extra_bytes`` (what else the kernel moves, e.g. attention scores written to memory): a
    thin product (few tokens per expert) is held by them."""
    c = calibration
    for name, x in (("m", m), ("n", n), ("k", k), ("batch", batch)):
        _v.count(name, x, minimum=1)
    waves, useful = _waves(m, n, batch, c)
    compute = batch * matmul_flops(m, n, k) / useful / (c.ceiling * c.peak_flops)
    moved = batch * matmul_bytes(m, n, k, dtype_bytes=dtype_bytes) + _v.number(
        "extra_bytes", extra_bytes, minimum=0
    )
    return max(compute, moved / c.mem_bandwidth) + c.fixed_s


def gemm_efficiency(
    m: int, n: int, k: int, calibration: GemmCalibration, *, batch: int = 1, **kw: float
) -> float:
    """The fraction of the card's peak an (m x k) @ (k x n) product reaches
    (:func:`gemm_time`): at 8192^3 in bf16 on an H100, 752.9 / 989 = 0.76 (its calibration)."""
    seconds = gemm_time(m, n, k, calibration, batch=batch, **kw)  # type: ignore[arg-type]
    return batch * matmul_flops(m, n, k) / (seconds * calibration.peak_flops)


def calibrate_gemm(
    n: int,
    achieved_flops: float,
    *,
    peak_flops: float,
    mem_bandwidth: float,
    sms: int,
    tile: tuple[int, int] = (128, 256),
    source: str = "",
) -> GemmCalibration:
    """The :class:`GemmCalibration` whose n x n x n product reaches ``achieved_flops``: its
    ceiling is the measured fraction of the peak over the product's wave and tile use."""
    base = GemmCalibration(peak_flops, mem_bandwidth, 1.0, sms, tile, 0.0, source)
    _, useful = _waves(_v.count("n", n, minimum=1), n, 1, base)
    ceiling = _v.number("achieved_flops", achieved_flops, positive=True) / peak_flops / useful
    return base._replace(ceiling=ceiling)


_H100_CHECK = (
    "the course's GPU check on an NVIDIA H100 80GB HBM3 (docs/gpu-check-2026-11-27.md, u17: an "
    "8192^3 bf16 matmul at 752.9 TFLOP/s, an FP8 torch._scaled_mm at 1,339) against the data "
    "sheet (989 bf16 and 1,979 FP8 dense TFLOP/s, 3.35 TB/s HBM3, 132 SMs); tiles of 128 x 256 "
    "outputs, the size of Hopper's large cuBLAS/CUTLASS tiles (an assumption)"
)
#: per card and dtype, each from one measured product. A100: no figure was measured here; its
#: products are assumed to reach the H100's bf16 ceiling on its own peak, bandwidth and SMs
#: (A100 80GB SXM data sheet: 312 TFLOP/s, 2.04 TB/s, 108 SMs).
GEMM_CALIBRATIONS: dict[str, GemmCalibration] = {
    "H100 bf16": calibrate_gemm(8192, 752.9e12, peak_flops=989e12, mem_bandwidth=3.35e12, sms=132,
                                source=_H100_CHECK),
    "H100 fp8": calibrate_gemm(8192, 1339e12, peak_flops=1979e12, mem_bandwidth=3.35e12, sms=132,
                               source=_H100_CHECK),
}  # fmt: skip
GEMM_CALIBRATIONS["A100 bf16"] = GEMM_CALIBRATIONS["H100 bf16"]._replace(
    peak_flops=312e12,
    mem_bandwidth=2.039e12,
    sms=108,
    source="assumed: the H100's bf16 ceiling (" + _H100_CHECK + ") on the A100 80GB SXM data "
    "sheet's 312 TFLOP/s, 2.04 TB/s and 108 SMs",
)
