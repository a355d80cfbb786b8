"""Part c, FP8: the one thing unit 17 cannot measure on a CPU, the speed of an FP8 GEMM.

``torch._scaled_mm`` on E4M3 operands (tensorwise scales, bf16 output) against a bf16 matmul of
the same shape, and the course's eager ``Float8Linear`` (forward + backward, casts included, no
``torch.compile``) against ``nn.Linear`` in bf16, with the part of its step that is GEMMs. Needs
FP8 tensor cores: compute capability 8.9 (Ada) or 9.0 (Hopper) and later. The datasheet's ratio
of peaks is 2 (H100 SXM: 1,979 vs 989 dense TFLOP/s); the check fails only if the FP8 GEMM is not
faster than bf16 at all.
"""

from __future__ import annotations

import torch

from course_tools.gpu_check.core import Figure, Outcome, Settings, failed, skipped
from course_tools.gpu_check.cuda_time import median_ms

#: the GEMM shape timed: large enough for the tensor cores to reach their stride
SIZE = 8192


def _layer_step(layer: torch.nn.Module, x: torch.Tensor) -> None:
    layer(x).float().pow(2).mean().backward()


def fp8_gemm_speed(settings: Settings) -> Outcome:
    """FP8 ``_scaled_mm`` vs bf16 matmul at 8192^3, and an FP8 layer step vs a bf16 one."""
    from course_lib.techniques.fp8 import fp8_matmul, relative_error, to_float8
    from course_lib.techniques.fp8_linear import Float8Linear

    if settings.device != "cuda" or torch.cuda.get_device_capability() < (8, 9):
        return skipped("FP8 tensor cores need a GPU of compute capability 8.9 or newer")
    gen = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(SIZE, SIZE, device="cuda", generator=gen)
    b = torch.randn(SIZE, SIZE, device="cuda", generator=gen)
    a16, b16, qa, qb = a.bfloat16(), b.bfloat16(), to_float8(a), to_float8(b)
    t16 = median_ms(lambda: a16 @ b16.t())
    t8 = median_ms(lambda: fp8_matmul(qa, qb, out_dtype=torch.bfloat16))
    out, how = fp8_matmul(qa, qb, out_dtype=torch.bfloat16)
    flops = 2 * SIZE**3
    lin = torch.nn.Linear(SIZE, SIZE, bias=False, device="cuda", dtype=torch.bfloat16)
    fp8_layer = Float8Linear.from_linear(lin, recipe="tensorwise")
    x = torch.randn(SIZE, SIZE, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    figures: dict[str, Figure] = {
        "bf16 matmul (TFLOP/s)": round(flops / t16 / 1e9, 1),
        f"FP8 {how} (TFLOP/s)": round(flops / t8 / 1e9, 1),
        "FP8 / bf16 GEMM speedup": round(t16 / t8, 3),
        "FP8 GEMM relative error vs fp32 (%)": round(100 * relative_error(out, a @ b.t()), 3),
        "bf16 nn.Linear fwd+bwd (ms)": round(median_ms(lambda: _layer_step(lin, x)), 3),
        "eager Float8Linear fwd+bwd (ms)": round(median_ms(lambda: _layer_step(fp8_layer, x)), 3),
        # the step's three products (y, dx, dw) are all SIZE^3: the rest of the step is the
        # amax, scale, cast, transpose and check passes that torch.compile would fuse
        "of which its 3 GEMMs, at the FP8 speed above (ms)": round(3 * t8, 3),
    }
    if t8 >= t16:
        return failed("the FP8 GEMM is not faster than bf16 on this GPU", figures)
    return Outcome(figures)
