"""Every check, in the order the report lists them."""

from __future__ import annotations

from course_tools.gpu_check import device_checks as dc
from course_tools.gpu_check import fp8_checks as f8
from course_tools.gpu_check import step_checks as st
from course_tools.gpu_check import unit_runs as ur
from course_tools.gpu_check.core import Check

CHECKS: tuple[Check, ...] = (
    Check("u01 allocator_demo", "a", ur.u01_allocator_demo, needs_cuda=True),
    Check("u01 compare_step_memory", "a", ur.u01_compare_step_memory),
    Check("u02 roofline_ops", "a", ur.u02_roofline),
    Check("u02 step_peak_bytes, throughput_vs_batch", "a", ur.u02_step_and_throughput),
    Check("u02 largest_batch_that_fits", "a", ur.u02_largest_batch),
    Check("u02 accumulation_memory_and_time", "a", ur.u02_accumulation),
    Check("u02 measure_matmul_throughput, gpt_step_mfu", "a", ur.u02_gpt_mfu),
    Check("u03 training_memory", "a", ur.u03_training_memory),
    Check("u03 matmul_speed", "a", ur.u03_matmul_speed),
    Check("u03 loss_curves", "a", ur.u03_loss_curves),
    Check("u05 parity", "a", ur.u05_parity),
    Check("u05 memory_fit", "a", ur.u05_memory_fit),
    Check("u05 step_breakdown", "a", ur.u05_step_breakdown),
    Check(
        "u19 profile, compile, flash vs naive attention", "a", st.inside_the_step, needs_cuda=True
    ),
    Check("MemoryMeter vs torch.cuda.max_memory_allocated", "b", dc.meter_vs_allocator),
    Check("u05 h2d_bandwidth: pinned vs pageable", "c", dc.pinned_vs_pageable, needs_cuda=True),
    Check("u17 FP8 GEMM (torch._scaled_mm) vs bf16", "c", f8.fp8_gemm_speed, needs_cuda=True),
    Check(
        "all-reduce parity and time, launch(backend='nccl')",
        "d",
        dc.nccl_all_reduce,
        needs_cuda=True,
        in_caller=True,
    ),
)


def find(name: str) -> Check:
    """The check called ``name``."""
    for check in CHECKS:
        if check.name == name:
            return check
    raise KeyError(f"no check named {name!r}")
