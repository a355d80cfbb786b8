"""Part a, unit 19: inside the step on a GPU, what the lecture can only describe on a CPU.

One check: the course's GPT step profiled with CUDA kernels (``measure.profile``), the caching
allocator's history (``torch.cuda.memory._record_memory_history``), the lecture's elementwise
chain eager against ``torch.compile`` (Triton kernels), ``techniques.flash`` at parity with SDPA
on the GPU, and SDPA's flash backend against the written-out attention in time and peak memory
(bf16, 16 heads of 64, 4,096 tokens). It fails if the flash backend is not faster and smaller.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable

import torch

from course_tools.gpu_check.core import Figure, Outcome, Settings, failed, skipped
from course_tools.gpu_check.cuda_time import median_ms


def _profile_and_history(figures: dict[str, Figure]) -> None:
    from course_lib.measure.profile import profile_step
    from course_lib.models import GPT, GPTConfig

    torch.manual_seed(0)
    cfg = GPTConfig.tiny(n_embd=256, n_head=8, n_layer=4, block_size=256)
    model = GPT(cfg).cuda()
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randint(0, cfg.vocab_size, (8, cfg.block_size), device="cuda")

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        model.loss(x, x).backward()
        opt.step()

    prof = profile_step(step)
    kernels = [s for s in prof.spans if s.kind == "kernel"]
    table = prof.table()
    figures["GPT step: GPU kernels launched"] = len(kernels)
    figures["GPT step: operators' GPU time (ms)"] = round(float(table.device_us.sum()) / 1e3, 3)
    figures["GPT step: top operator by GPU time"] = str(table.nlargest(1, "device_us").name.iloc[0])
    torch.cuda.memory._record_memory_history(max_entries=100_000)
    try:
        step()
        snapshot = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    events = [e for trace in snapshot["device_traces"] for e in trace]
    figures["memory history: allocator events in one step"] = len(events)


def _compiled_chain(figures: dict[str, Figure]) -> None:
    # loaded by name, as unit_runs loads the units: this tool stands above them
    run = importlib.import_module("course_lib.units.u19_inside_the_step.run")
    x, b, r, w, lb = (t.cuda() for t in run.chain_inputs(8192, 4096))
    compiled = torch.compile(run.fused_chain)
    eager_ms = median_ms(lambda: run.fused_chain(x, b, r, w, lb))
    compiled_ms = median_ms(lambda: compiled(x, b, r, w, lb))
    figures["fused chain 8192 x 4096: eager (ms)"] = round(eager_ms, 3)
    figures["fused chain: torch.compile (ms)"] = round(compiled_ms, 3)


def _forward_backward(attention: Callable[[], torch.Tensor]) -> None:
    attention().sum().backward()


def _attention(figures: dict[str, Figure]) -> bool:
    """SDPA's flash backend against the written-out attention; True when flash wins both."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from course_lib.techniques.flash import flash_attention, naive_attention

    sq, sk, sv = (torch.randn(1, 2, 77, 32, device="cuda", dtype=torch.float64) for _ in "qkv")
    ref = torch.nn.functional.scaled_dot_product_attention(sq, sk, sv, is_causal=True)
    err = (flash_attention(sq, sk, sv, causal=True, block_size=16) - ref).abs().max()
    figures["course flash_attention vs SDPA on the GPU (max abs error, fp64)"] = float(err)
    q, k, v = (
        torch.randn(1, 16, 4096, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        for _ in range(3)
    )
    results = {}
    for name, fn in (
        (
            "SDPA flash backend",
            lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True),
        ),
        ("written-out attention", lambda: naive_attention(q, k, v, causal=True)),
    ):
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            ms = median_ms(functools.partial(_forward_backward, fn), repeat=5)
            peak = torch.cuda.max_memory_allocated() - base
        results[name] = (ms, peak)
        figures[f"{name} fwd+bwd (ms)"] = round(ms, 3)
        figures[f"{name} peak above inputs (MiB)"] = round(peak / 2**20, 1)
    (t_flash, m_flash), (t_naive, m_naive) = results.values()
    return t_flash < t_naive and m_flash < m_naive


def inside_the_step(settings: Settings) -> Outcome:
    """Unit 19 on a GPU: CUDA profile, allocator history, compile, flash vs naive attention."""
    if settings.device != "cuda":
        return skipped("CUDA kernels, the allocator history and SDPA's flash backend need a GPU")
    figures: dict[str, Figure] = {}
    _profile_and_history(figures)
    _compiled_chain(figures)
    if not _attention(figures):
        return failed(
            "SDPA's flash backend is not both faster and smaller than the written-out attention",
            figures,
        )
    return Outcome(figures)
