"""Unit 19, "Fusion": bias + GELU + dropout + residual + LayerNorm, eager (one pass over memory
per operator) against ``torch.compile`` (inductor fuses the chain into one C++ loop on CPU).
Re-exported by ``run.py``.
"""

from __future__ import annotations

import shutil
import statistics
import time
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch
import torch.nn.functional as F

from course_lib import kit, validate
from course_lib.measure.profile import profile_step
from course_lib.measure.timing import time_fn


@dataclass(frozen=True)
class FusionBytesRow:
    """:func:`fusion_bytes`: what one operator (or the fused loop) reads and writes."""

    op: str
    read_bytes: int
    written_bytes: int
    path: str
    bytes: int


def fused_chain(x, bias, residual, weight, ln_bias, p: float = 0.1):
    """LayerNorm(residual + dropout(GELU(x + bias))): the chain after a transformer's MLP."""
    y = F.gelu(x + bias)  # (rows, width)
    y = F.dropout(y, p=p, training=True)
    return F.layer_norm(residual + y, (x.shape[-1],), weight, ln_bias)


Chain = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def chain_inputs(rows: int, width: int, *, seed: int = 0) -> Chain:
    """(x, bias, residual, weight, ln_bias), float32."""
    rows = validate.count("rows", rows, minimum=1)
    width = validate.count("width", width, minimum=1)
    g = torch.Generator().manual_seed(seed)
    x, residual = torch.randn(rows, width, generator=g), torch.randn(rows, width, generator=g)
    return x, torch.randn(width, generator=g), residual, torch.ones(width), torch.zeros(width)


def fusion_bytes(rows: int, width: int) -> pd.DataFrame:
    """Bytes each eager operator reads and writes (float32 values, the dropout mask 1 byte a
    value; bias, weight and the LayerNorm's per-row statistics are negligible and left out),
    and the fused loop's: read x and the residual, write the output. One row per operator
    plus a "fused" row."""
    n = validate.count("rows", rows, minimum=1) * validate.count("width", width, minimum=1)
    eager = [  # (operator, values read, values written, extra bytes written)
        ("add (bias)", n, n, 0),
        ("gelu", n, n, 0),
        ("dropout", n, n, n),
        ("add (residual)", 2 * n, n, 0),
        ("layer_norm", n, n, 0),
    ]
    moved = [(op, 4 * r, 4 * w + extra, "eager") for op, r, w, extra in eager]
    moved.append(("fused", 8 * n, 4 * n, "fused"))
    out = [FusionBytesRow(op, r, w, path, r + w) for op, r, w, path in moved]
    return kit.frame(out, FusionBytesRow)


def compiler() -> str | None:
    """The C++ compiler inductor would call on CPU (``CXX``, else c++ / g++ / clang++), or None."""
    import os

    for name in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if name and shutil.which(name):
            return name
    return None


def _generated_code(compiled, args) -> tuple[Any, str]:
    """Run ``compiled`` once and return (its output, the source inductor generated)."""
    try:
        from torch._inductor.utils import run_and_get_code  # private: fall back to no code
    except ImportError:  # pragma: no cover - torch without inductor's helper
        return compiled(*args), ""
    out, code = run_and_get_code(compiled, *args)
    return out, "\n".join(code)


def eager_vs_compiled(rows: int = 2048, width: int = 1024, *, repeat: int = 10) -> dict[str, Any]:
    """The chain eager and compiled: median ms of each (``repeat`` calls of each after warm-up,
    alternating), the seconds the first compiled call took (tracing + C++ compile), the
    generated source, and the eager call's profile table (which operators its time goes to).
    Without a C++ compiler: eager alone, ``compiled_ms`` None and ``reason`` says why."""
    args = chain_inputs(rows, width)
    repeat = validate.count("repeat", repeat, minimum=1)
    eager = time_fn(lambda: fused_chain(*args), warmup=2, repeat=repeat)
    res: dict[str, Any] = {
        "rows": rows,
        "width": width,
        "eager_ms": eager.median_s * 1e3,
        "eager_ops": profile_step(lambda: fused_chain(*args)).table(),
        "compiled_ms": None,
        "compile_s": None,
        "code": "",
        "reason": "",
    }
    if compiler() is None:
        res["reason"] = "no C++ compiler (c++, g++ or clang++) on PATH: inductor cannot build"
        return res
    torch._dynamo.reset()
    compiled = torch.compile(fused_chain)
    t0 = time.perf_counter()
    try:
        _, res["code"] = _generated_code(compiled, args)
    except Exception as exc:  # inductor's build failed: report it, do not stop the lecture
        res["reason"] = f"torch.compile failed here: {type(exc).__name__}: {str(exc)[:200]}"
        return res
    res["compile_s"] = time.perf_counter() - t0
    res["eager_ms"], res["compiled_ms"] = _interleaved_ms(
        lambda: fused_chain(*args), lambda: compiled(*args), repeat
    )
    return res


def _interleaved_ms(a, b, repeat: int) -> tuple[float, float]:
    """Median ms of ``a()`` and of ``b()``, timed alternately (a, b, a, b, ...) after one
    untimed call of each, so that a change in the machine's load hits both alike."""
    a(), b()
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeat):
        for fn, out in ((a, times[0]), (b, times[1])):
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times[0]), statistics.median(times[1])


def fused_loop(code: str, *, lines: int = 30) -> str:
    """The first ``lines`` lines of the first C++ kernel in inductor's generated source."""
    start = code.find('extern "C"')
    if start < 0:
        return ""
    return "\n".join(code[start:].splitlines()[:lines])
