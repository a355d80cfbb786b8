"""Parts b, c and d: the memory meter against the allocator, pinned copies, NCCL collectives."""

from __future__ import annotations

import statistics

import torch
import torch.distributed as dist

import course_lib
from course_lib.measure import estimate
from course_lib.measure.memory import MemoryMeter
from course_lib.measure.timing import time_collective
from course_lib.models import GPT, GPTConfig
from course_lib.runtime.device import rank_device, sync
from course_tools.gpu_check.core import Figure, Outcome, Settings, failed, skipped
from course_tools.gpu_check.unit_runs import unit_run

MiB = 2**20
#: the meter must explain the allocator's peak to within this share of it (after subtracting
#: what was allocated before the block and is invisible to it, e.g. cuBLAS's workspace)
METER_TOLERANCE = 0.10
#: bytes of the buffer the all-reduce is timed on, and of the one its parity is checked on
ALL_REDUCE_BYTES = 64 * MiB
PARITY_NUMEL = 2**16


# --------------------------------------------------------------------------------------------
# b. MemoryMeter against torch.cuda.max_memory_allocated
# --------------------------------------------------------------------------------------------
def _gpt_step(model: GPT, opt: torch.optim.Optimizer, idx: torch.Tensor) -> None:
    model.loss(idx, idx).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def meter_vs_allocator(settings: Settings) -> Outcome:
    """A GPT training step under MemoryMeter; its peak against the allocator's own peak."""
    cuda = settings.device == "cuda"
    config = GPTConfig.tiny(n_layer=4, n_embd=256, block_size=128) if cuda else GPTConfig.tiny()
    device = torch.device(settings.device)
    torch.manual_seed(0)
    model = GPT(config).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    idx = torch.randint(0, config.vocab_size, (16 if cuda else 4, config.block_size), device=device)
    _gpt_step(model, opt, idx)  # Adam's state and the libraries' workspaces exist from here on
    sync(device)
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
    with MemoryMeter(model, opt, track=(idx,), device=device) as meter:
        _gpt_step(model, opt, idx)
    sync(device)
    figures: dict[str, Figure] = {
        "meter peak (MiB)": round((meter.peak_bytes or 0) / MiB, 3),
        "meter peak phase": str(meter.peak_phase),
    }
    if not cuda:
        note = "torch.cuda.max_memory_allocated needs CUDA: the meter ran on cpu, unchecked"
        return skipped(note, figures)
    return _compare_with_allocator(meter, before, torch.cuda.max_memory_allocated(device), figures)


def _compare_with_allocator(
    meter: MemoryMeter, before: int, allocator_peak: int, figures: dict[str, Figure]
) -> Outcome:
    unseen = before - sum((meter.start_breakdown or {}).values())  # allocated, not a tensor
    residual = allocator_peak - int(meter.peak_bytes or 0)
    figures.update(
        {
            "torch.cuda.max_memory_allocated (MiB)": round(allocator_peak / MiB, 3),
            "residual: allocator - meter (MiB)": round(residual / MiB, 3),
            "allocated before the block, unseen by the meter (MiB)": round(unseen / MiB, 3),
            "residual beyond that (% of allocator peak)": round(
                100 * (residual - unseen) / allocator_peak, 2
            ),
        }
    )
    if abs(residual - unseen) > METER_TOLERANCE * allocator_peak:
        return failed(f"the meter misses more than {METER_TOLERANCE:.0%} of the peak", figures)
    return Outcome(figures)


# --------------------------------------------------------------------------------------------
# c. pinned vs pageable copies (unit 05's h2d_bandwidth)
# --------------------------------------------------------------------------------------------
def pinned_vs_pageable(settings: Settings) -> Outcome:
    """A 256 MiB copy each way from pinned and pageable memory; pinned must be faster."""
    df = unit_run("u05").h2d_bandwidth(256 * MiB, repeat=7)
    gbps = {(row.memory, row.direction): float(row.GBps) for row in df.itertuples()}
    figures: dict[str, Figure] = {
        f"{memory}, {direction} (GB/s)": round(v, 2) for (memory, direction), v in gbps.items()
    }
    slower = [d for m, d in gbps if m == "pinned" and gbps[(m, d)] <= gbps[("pageable", d)]]
    if slower:
        return failed(f"pinned is not faster than pageable: {', '.join(slower)}", figures)
    return Outcome(figures)


# --------------------------------------------------------------------------------------------
# d. NCCL all-reduce through course_lib.launch, one GPU per rank
# --------------------------------------------------------------------------------------------
def all_reduce_rank(rank: int, world_size: int, nbytes: int = ALL_REDUCE_BYTES) -> dict[str, float]:
    """In each rank: all-reduce known random tensors and compare with the sum made locally;
    then time an all-reduce of ``nbytes`` (the slowest rank's time, median of 5)."""
    device = rank_device()
    parts = [
        torch.randn(PARITY_NUMEL, generator=torch.Generator().manual_seed(r))
        for r in range(world_size)
    ]
    mine = parts[rank].to(device, copy=True)  # all_reduce works in place
    dist.all_reduce(mine)
    expected = torch.stack(parts).double().sum(0)
    error = float((mine.cpu().double() - expected).abs().max())
    buf = torch.empty(nbytes // 4, device=device)
    times = time_collective(
        lambda: dist.all_reduce(buf),
        warmup=2,
        repeat=5,
        device=device,
        setup=lambda: buf.fill_(1.0),
    )
    return {"max_abs_error": error, "median_s": statistics.median(times)}


def nccl_all_reduce(settings: Settings) -> Outcome:
    """launch(fn, n, backend="nccl") on every GPU: all-reduce parity, then its bandwidth."""
    n = torch.cuda.device_count()
    if n < 2:
        return skipped(f"one GPU (torch.cuda.device_count() = {n}): NCCL needs one per rank")
    ranks = course_lib.launch(all_reduce_rank, n, backend="nccl", timeout=settings.timeout_s)
    return all_reduce_outcome(ranks, n, ALL_REDUCE_BYTES, backend="nccl")


def all_reduce_outcome(
    ranks: list[dict[str, float]], world_size: int, nbytes: int, *, backend: str
) -> Outcome:
    """Figures of :func:`all_reduce_rank`'s answers; failed if a sum is off by more than 1e-4."""
    error = max(r["max_abs_error"] for r in ranks)
    seconds = ranks[0]["median_s"]
    algbw = nbytes / seconds
    figures: dict[str, Figure] = {
        "ranks": world_size,
        "backend": backend,
        "parity: max |all-reduced - expected|": float(f"{error:.3g}"),
        f"all-reduce of {nbytes // MiB} MiB, median (ms)": round(seconds * 1e3, 3),
        "algbw (GB/s)": round(algbw / 1e9, 2),
        "busbw (GB/s)": round(estimate.busbw(algbw, "all_reduce", world_size) / 1e9, 2),
    }
    if error > 1e-4:
        return failed("the all-reduced sum differs from the sum made locally", figures)
    return Outcome(figures)
