"""Unit 19, "The roofline per operator": this machine's two roofs (a matmul's FLOP/s and a
STREAM-style copy's bytes/s), each operator of a GPT block predicted from its FLOPs and bytes,
and measured one at a time under ``torch.profiler``. Re-exported by ``run.py``.

The roofline model: Williams, Waterman and Patterson 2009, "Roofline: an insightful visual
performance model", CACM 52(4). An operator of F FLOPs that moves B bytes takes at least
max(F / peak, B / bandwidth); it is memory-bound when its arithmetic intensity F / B is below
the ridge peak / bandwidth. H100 SXM figures: NVIDIA's datasheet (989 TFLOP/s dense BF16,
3.35 TB/s HBM3).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch
import torch.nn.functional as F

from course_lib import kit, validate
from course_lib.measure.profile import profile_step
from course_lib.measure.timing import time_fn

#: NVIDIA H100 SXM datasheet: dense BF16 tensor-core FLOP/s and HBM3 bytes/s
H100 = {"name": "H100 SXM (datasheet, bf16)", "flops_per_s": 989e12, "bytes_per_s": 3.35e12}

#: FLOPs per element the course counts for each elementwise operator (a convention: what
#: matters is that it is a handful, not thousands)
ELEMENTWISE_FLOPS = {"add": 1, "gelu": 8, "layernorm": 8, "softmax": 5}


@dataclass(frozen=True)
class OpRow:
    """:func:`op_table`: one operator's FLOPs, bytes, intensity and roofline prediction."""

    op: str
    flops: int
    bytes: int
    intensity: float
    bound: str
    predicted_us: float


def machine_roofs(*, n: int = 512, copy_mib: int = 64, repeat: int = 5) -> dict[str, Any]:
    """Measured here: float32 matmul FLOP/s (an n x n x n product, 2 n^3 FLOPs) and copy
    bandwidth (``dst.copy_(src)`` of ``copy_mib`` MiB: reads it once and writes it once), each
    the median of ``repeat`` timed calls; the ridge point is their ratio."""
    n = validate.count("n", n, minimum=16)
    copy_mib = validate.count("copy_mib", copy_mib, minimum=1)
    a, b = torch.randn(n, n), torch.randn(n, n)
    mm = time_fn(lambda: a @ b, warmup=2, repeat=repeat)
    src = torch.randn(copy_mib * 2**20 // 4)
    dst = torch.empty_like(src)
    cp = time_fn(lambda: dst.copy_(src), warmup=2, repeat=repeat)
    flops_per_s = 2 * n**3 / mm.median_s
    bytes_per_s = 2 * src.numel() * 4 / cp.median_s
    return {
        "name": f"this machine ({torch.get_num_threads()} threads, fp32)",
        "flops_per_s": flops_per_s,
        "bytes_per_s": bytes_per_s,
        "ridge": flops_per_s / bytes_per_s,
    }


def op_cost(op: Mapping[str, Any]) -> tuple[int, int]:
    """(FLOPs, bytes moved) of one operator, each tensor read or written once:

    * ``{"kind": "matmul", "m", "k", "n", "bytes_per_value"}``: (m, k) @ (k, n): 2mkn FLOPs,
      (mk + kn + mn) values;
    * ``{"kind": "elementwise", "numel", "inputs", "outputs", "flops_per_element",
      "bytes_per_value"}``: numel x flops_per_element FLOPs, numel x (inputs + outputs) values.
    """
    kind = validate.choice("op['kind']", op.get("kind"), ("matmul", "elementwise"))

    def field(name: str, minimum: int = 1) -> int:
        return validate.count(f"op[{name!r}]", op.get(name), minimum=minimum)

    b = field("bytes_per_value")
    if kind == "matmul":
        m, k, n = (field(d) for d in "mkn")
        return 2 * m * k * n, (m * k + k * n + m * n) * b
    numel, io = field("numel"), field("inputs") + field("outputs")
    return numel * field("flops_per_element", minimum=0), numel * io * b


def roofline(
    ops: Sequence[Mapping[str, Any]], flops_per_s: float, bytes_per_s: float
) -> list[tuple[str, float]]:
    """For each operator: ("memory" or "compute", its roofline time in seconds). Memory-bound
    when its intensity FLOPs / bytes is below the ridge flops_per_s / bytes_per_s (a tie
    counts as compute); the time is max(FLOPs / flops_per_s, bytes / bytes_per_s)."""
    peak = validate.number("flops_per_s", flops_per_s, positive=True)
    bw = validate.number("bytes_per_s", bytes_per_s, positive=True)
    out = []
    for op in ops:
        flops, nbytes = op_cost(op)
        bound = "memory" if flops * bw < peak * nbytes else "compute"
        out.append((bound, max(flops / peak, nbytes / bw)))
    return out


def _ew(name: str, numel: int, inputs: int, b: int, row: int) -> dict[str, Any]:
    return dict(
        name=name, kind="elementwise", numel=numel, inputs=inputs, outputs=1,
        flops_per_element=ELEMENTWISE_FLOPS[name.split()[0]], bytes_per_value=b, row=row,
    )  # fmt: skip


def block_ops(
    tokens: int, width: int, heads: int, seq: int, *, bytes_per_value: int = 4
) -> list[dict[str, Any]]:
    """The operators of one GPT block's forward at ``tokens`` = batch x seq rows: its four
    matmuls (QKV, attention output, MLP up and down), the attention softmax over
    (batch x heads x seq x seq) scores, GELU, a LayerNorm and a residual add."""
    t, c = validate.count("tokens", tokens, minimum=1), validate.count("width", width, minimum=1)
    h, s = validate.count("heads", heads, minimum=1), validate.count("seq", seq, minimum=1)
    b = validate.count("bytes_per_value", bytes_per_value, minimum=1)
    mm = [("matmul qkv", 3 * c), ("matmul out", c), ("matmul mlp up", 4 * c)]
    ops = [dict(name=n, kind="matmul", m=t, k=c, n=out, bytes_per_value=b) for n, out in mm]
    ops.append(dict(name="matmul mlp down", kind="matmul", m=t, k=4 * c, n=c, bytes_per_value=b))
    ops += [
        _ew("softmax", (t // s) * h * s * s, 1, b, s),
        _ew("gelu", t * 4 * c, 1, b, 4 * c),
        _ew("layernorm", t * c, 1, b, c),
        _ew("add (residual)", t * c, 2, b, c),
    ]
    return ops


def op_table(ops: Sequence[Mapping[str, Any]], roofs: Mapping[str, Any]) -> pd.DataFrame:
    """One row per operator: FLOPs, bytes, intensity, bound and predicted µs under ``roofs``."""
    preds = roofline(ops, roofs["flops_per_s"], roofs["bytes_per_s"])
    rows = []
    for op, (bound, seconds) in zip(ops, preds):
        flops, nbytes = op_cost(op)
        name = op.get("name", op["kind"])
        rows.append(OpRow(name, flops, nbytes, flops / nbytes, bound, seconds * 1e6))
    return kit.frame(rows, OpRow)


def _runner(op: Mapping[str, Any]) -> Callable[[], Any]:
    """A zero-argument call of the operator ``op`` describes, on random float32 tensors."""
    name = str(op.get("name", ""))
    if op["kind"] == "matmul":
        a, b = torch.randn(op["m"], op["k"]), torch.randn(op["k"], op["n"])
        return lambda: a @ b
    row = int(op.get("row", op["numel"]))  # softmax and LayerNorm work along rows of this size
    x = torch.randn(op["numel"] // row, row)
    if name.startswith("gelu"):
        return lambda: F.gelu(x)
    if name.startswith("softmax"):
        return lambda: torch.softmax(x, dim=-1)
    if name.startswith("layernorm"):
        return lambda: F.layer_norm(x, (row,))
    y = torch.randn_like(x)
    return lambda: x + y


def _repeated(call: Callable[[], Any], times: int) -> Callable[[], None]:
    def step() -> None:
        for _ in range(times):
            call()

    return step


def measure_ops(ops: Sequence[Mapping[str, Any]], *, repeat: int = 5) -> list[float]:
    """Each operator run ``repeat`` times under the profiler: the mean duration of its
    top-level operator events, µs (the profiler's clock, not a timer around the call)."""
    repeat = validate.count("repeat", repeat, minimum=1)
    out = []
    for op in ops:
        prof = profile_step(_repeated(_runner(op), repeat), warmup=1)
        spans = [s.duration_us for s in prof.spans if s.kind == "op"]
        out.append(sum(spans) / len(spans))
    return out
