"""Unit 02, the roofline: peak compute, memory bandwidth, and where training operations sit.

Used by notebooks/02_batch_size_and_accumulation.ipynb through :mod:`run` (which re-exports these
names).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pandas as pd
import torch
from torch import nn

from course_lib import kit, validate
from course_lib.measure import estimate
from course_lib.measure.timing import time_fn
from course_lib.runtime.device import default_device, sync


# --------------------------------------------------------------------------------------------
# Roofline: peak compute, memory bandwidth, and where training operations sit
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class OpCost:
    """Work and traffic of one operation, the two coordinates of the roofline."""

    name: str
    flops: int
    """Floating-point operations (a multiply-add counts as 2)."""
    bytes: int
    """Bytes read from and written to memory at least once (inputs + outputs)."""

    @property
    def intensity(self) -> float:
        """Arithmetic intensity, FLOP per byte moved."""
        return estimate.arithmetic_intensity(self.flops, self.bytes)


@dataclass(frozen=True)
class RooflineRow:
    """One operation placed on this machine's roofline (:func:`roofline_ops`)."""

    op: str
    flops: int
    bytes: int
    intensity: float
    median_s: float
    flop_per_s: float
    attainable_flop_per_s: float
    bound: str


def matmul_op_cost(m: int, n: int, k: int, dtype: torch.dtype = torch.float32) -> OpCost:
    """(m, k) @ (k, n): 2mnk FLOP; reads both inputs and writes the output once
    (``estimate.matmul_flops``, ``estimate.matmul_bytes``)."""
    flops = estimate.matmul_flops(m, n, k)
    nbytes = estimate.matmul_bytes(m, n, k, dtype_bytes=estimate.dtype_bytes(dtype))
    return OpCost(f"matmul {m}x{k}@{k}x{n}", int(flops), int(nbytes))


def elementwise_op_cost(op: str, numel: int, dtype: torch.dtype = torch.float32) -> OpCost:
    """An elementwise op reads its input once and writes its output once; FLOP per element
    from ``estimate.ELEMENTWISE_FLOPS`` (``estimate.elementwise_cost``)."""
    if op not in estimate.ELEMENTWISE_FLOPS:
        raise ValueError(f"op must be one of {sorted(estimate.ELEMENTWISE_FLOPS)}, got {op!r}")
    cost = estimate.elementwise_cost(
        numel, flops_per_element=op, dtype_bytes=estimate.dtype_bytes(dtype)
    )
    return OpCost(f"{op} {numel:,} el.", int(cost.flops), int(cost.bytes))


def measure_matmul_throughput(
    n: int = 1024, *, device=None, dtype=torch.float32, warmup: int = 2, repeat: int = 5
) -> dict:
    """Median FLOP/s of an n x n x n matmul: our stand-in for the machine's peak compute."""
    device = torch.device(device) if device is not None else default_device()
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    cost = matmul_op_cost(n, n, n, dtype)
    median_s = time_op(functools.partial(torch.mm, a, b), device, warmup, repeat)
    return {"n": n, "flops": cost.flops, "median_s": median_s, "flop_per_s": cost.flops / median_s}


def measure_copy_bandwidth(
    nbytes: int = 64 * 2**20, *, device=None, warmup: int = 2, repeat: int = 5
) -> dict:
    """Median bytes/s of copying a large tensor: it reads nbytes and writes nbytes."""
    device = torch.device(device) if device is not None else default_device()
    if nbytes < 4:
        raise ValueError(f"nbytes must be >= 4, got {nbytes}")
    src = torch.randn(nbytes // 4, device=device)
    dst = torch.empty_like(src)
    median_s = time_op(functools.partial(dst.copy_, src), device, warmup, repeat)
    moved = 2 * src.numel() * src.element_size()  # read + write
    return {"nbytes": moved, "median_s": median_s, "bytes_per_s": moved / median_s}


def _roofline_jobs(
    matmul_sizes: Sequence[int], elementwise_numel: int, device: torch.device
) -> list[tuple[OpCost, Callable[[], object]]]:
    """(cost, function to time) for each matmul size, a GELU and a LayerNorm."""
    jobs: list[tuple[OpCost, Callable[[], object]]] = []
    for n in matmul_sizes:
        a = torch.randn(n, n, device=device)
        b = torch.randn(n, n, device=device)
        # a small matmul is fast: repeat it inside the timed function so timer overhead is small
        inner = max(1, int(2**24 // (2 * n**3)))
        cost = matmul_op_cost(n, n, n)
        jobs.append(
            (
                OpCost(cost.name, cost.flops * inner, cost.bytes * inner),
                _repeated(functools.partial(torch.mm, a, b), inner),
            )
        )
    x = torch.randn(elementwise_numel, device=device)
    hidden = 1024
    x2 = x.view(-1, hidden)  # (rows, hidden)
    ln = nn.LayerNorm(hidden).to(device)
    jobs.append((elementwise_op_cost("gelu", x.numel()), lambda: nn.functional.gelu(x)))
    jobs.append((elementwise_op_cost("layernorm", x.numel()), lambda: ln(x2)))
    return jobs


def time_op(fn: Callable[[], object], device: torch.device, warmup: int, repeat: int) -> float:
    """Median seconds of one call of ``fn``, the device synchronized inside the timed call
    (the unit's timer: ops, training steps, accumulated steps)."""

    def run() -> None:
        fn()
        sync(device)

    return time_fn(run, warmup=warmup, repeat=repeat).median_s


def roofline_ops(
    *,
    matmul_sizes: Sequence[int] = (16, 64, 256, 1024),
    elementwise_numel: int = 2**22,
    device=None,
    warmup: int = 2,
    repeat: int = 5,
) -> tuple[pd.DataFrame, dict]:
    """Time matmuls, a GELU and a LayerNorm; measure bandwidth; place each op on the roofline.

    The compute roof is the fastest matmul measured here (what PyTorch reaches on this machine,
    not a vendor's peak); the bandwidth roof is a large copy (measure_copy_bandwidth).
    Returns (ops, machine): one row per op with flops, bytes, intensity (FLOP/B), measured
    FLOP/s, the roofline's attainable FLOP/s at that intensity, and which roof bounds it; and the
    machine's peak FLOP/s, bandwidth and ridge point (FLOP/B where the two roofs meet).
    """
    device = torch.device(device) if device is not None else default_device()
    validate.counts("matmul_sizes", matmul_sizes)
    bw = measure_copy_bandwidth(device=device, warmup=warmup, repeat=repeat)["bytes_per_s"]

    jobs = _roofline_jobs(matmul_sizes, elementwise_numel, device)
    with torch.no_grad():
        timed = [(cost, time_op(fn, device, warmup, repeat)) for cost, fn in jobs]
    matmuls = [(c, s) for c, s in timed if c.name.startswith("matmul")]
    best, best_s = max(matmuls, key=lambda cs: cs[0].flops / cs[1])
    peak = best.flops / best_s
    ridge = estimate.ridge_point(peak, bw)
    machine = {
        "peak_flop_per_s": peak,
        "peak_source": best.name,
        "bandwidth_bytes_per_s": bw,
        "ridge_flop_per_byte": ridge,
        "device": str(device),
    }
    rows = [
        RooflineRow(
            c.name,
            c.flops,
            c.bytes,
            c.intensity,
            s,
            c.flops / s,
            estimate.attainable_flops(c.intensity, peak, bw),
            "compute" if c.intensity >= ridge else "memory",
        )
        for c, s in timed
    ]
    return kit.frame(rows, RooflineRow), machine


def _repeated(fn: Callable[[], object], times: int) -> Callable[[], None]:
    def run():
        for _ in range(times):
            fn()

    return run
