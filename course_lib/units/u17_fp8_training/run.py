"""Unit 17's measured runs (notebooks/17_fp8_training.ipynb): FP8 training, measured for error
and bytes on the CPU, with speed taken to real sizes by formulas and cited figures only.

- numerics (``run_numerics.py``): :func:`formats_table` (torch's E4M3/E5M2 beside the paper),
  :func:`outlier_table` (real activations of the unit's GPT with one channel grown, cast per
  scaling), :func:`recipe_errors` (each ``Float8Linear`` recipe's output and gradient error
  against fp32, bf16 for scale), :func:`scaled_mm_parity` (``torch._scaled_mm`` against the
  emulated product);
- training (``run_training.py``): :func:`train_curves` / :func:`curve_summary` (fp32, bf16 and
  each recipe on the same batches, with and without an outlier channel), :func:`delayed_spike`;
- bytes (``run_bytes.py``): :func:`allgather_bytes` (ZeRO-3 gathering fp32, bf16 or FP8 on real
  gloo ranks) with :func:`allgather_summary` and :func:`memory_summary`, :func:`weight_cache_bytes`;
- at scale (``run_scale.py``): :func:`speedup_table`, :func:`peak_matmul_table`,
  :func:`fsdp_table`, :func:`dispatch_table`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from course_lib import kit
from course_lib.units.u17_fp8_training._setup import BLOCK, CONFIG, batch_fn, model_fn
from course_lib.units.u17_fp8_training.run_bytes import (
    allgather_bytes,
    allgather_summary,
    memory_summary,
    weight_cache_bytes,
)
from course_lib.units.u17_fp8_training.run_numerics import (
    formats_table,
    outlier_table,
    recipe_errors,
    scaled_mm_parity,
)
from course_lib.units.u17_fp8_training.run_scale import (
    LLAMA3,
    dispatch_table,
    fsdp_table,
    peak_matmul_table,
    speedup_table,
)
from course_lib.units.u17_fp8_training.run_training import (
    PRECISIONS,
    curve_summary,
    delayed_spike,
    train_curves,
)

__all__ = [
    "BLOCK",
    "CONFIG",
    "batch_fn",
    "model_fn",
    "allgather_bytes",
    "allgather_summary",
    "memory_summary",
    "weight_cache_bytes",
    "formats_table",
    "outlier_table",
    "recipe_errors",
    "scaled_mm_parity",
    "LLAMA3",
    "peak_matmul_table",
    "dispatch_table",
    "fsdp_table",
    "speedup_table",
    "PRECISIONS",
    "curve_summary",
    "delayed_spike",
    "train_curves",
    "torchao_available",
    "torchao_parity",
]


@dataclass(frozen=True)
class TorchaoRow:
    """:func:`torchao_parity`: one shape; the output's and each gradient's largest difference to
    torchao's, relative to torchao's largest value (the course's layer, then the fp32 layer)."""

    shape: str = field(metadata=kit.column("shape (batch, in, out)"))
    output: float = field(metadata=kit.column("course vs torchao: output"))
    input_grad: float = field(metadata=kit.column("course vs torchao: input grad"))
    weight_grad: float = field(metadata=kit.column("course vs torchao: weight grad"))
    fp32_output: float = field(metadata=kit.column("fp32 layer vs torchao: output"))
    fp32_input_grad: float = field(metadata=kit.column("fp32 layer vs torchao: input grad"))
    fp32_weight_grad: float = field(metadata=kit.column("fp32 layer vs torchao: weight grad"))


def torchao_available() -> str | None:
    """torchao's version when it is installed (its float8 training could then be compared with
    ours), else None: the course does not depend on it."""
    from course_lib.runtime.compat import quiet_import_logs

    try:
        with quiet_import_logs():
            import torchao
    except ImportError:
        return None
    return str(getattr(torchao, "__version__", "unknown"))


def torchao_parity(shapes=((16, 32, 64), (64, 128, 32), (128, 128, 512))) -> Any:
    """The course's tensorwise ``Float8Linear`` against torchao's (``convert_to_float8_training``,
    its default dynamic tensorwise recipe) on the same fp32 weight, input (normal x 3) and
    upstream gradient: per (batch, in, out) shape, the largest |difference| of the output, the
    input gradient and the weight gradient, each relative to the largest |value| of torchao's,
    and the same for the plain fp32 layer against torchao's (what FP8 changes). Needs torchao
    (``torchao_available``); refuses with one line where it does not import."""
    import copy
    import warnings

    import torch

    from course_lib.runtime.compat import quiet_import_logs
    from course_lib.techniques.fp8_linear import Float8Linear

    try:
        with warnings.catch_warnings(), quiet_import_logs():
            warnings.simplefilter("ignore")
            import torchao.float8 as float8
    except Exception as exc:  # noqa: BLE001 - absent, or built for another torch
        raise RuntimeError(
            f"torchao = not importable ({exc}): expected torchao installed"
        ) from None
    rows = []
    for batch, n_in, n_out in shapes:
        torch.manual_seed(0)
        linear = torch.nn.Linear(n_in, n_out, bias=False)
        theirs = torch.nn.Sequential(copy.deepcopy(linear))
        float8.convert_to_float8_training(theirs)
        ours = Float8Linear.from_linear(copy.deepcopy(linear), recipe="tensorwise")
        x, grad = torch.randn(batch, n_in) * 3, torch.randn(batch, n_out)
        results = []
        for layer in (theirs, ours, linear):
            xi = x.clone().requires_grad_()
            layer.zero_grad(set_to_none=True)
            y = layer(xi)
            y.backward(grad)
            w = layer[0].weight if isinstance(layer, torch.nn.Sequential) else layer.weight
            results.append((y.detach(), xi.grad, w.grad))
        gaps = [
            float((a - b).abs().max() / b.abs().max())
            for got in results[1:]  # the course's layer, then the plain fp32 one
            for a, b in zip(got, results[0])
        ]
        rows.append(TorchaoRow(f"{batch} x {n_in} x {n_out}", *gaps))
    return kit.frame(rows, TorchaoRow)
