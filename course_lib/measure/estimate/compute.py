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
