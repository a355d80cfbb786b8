"""Unit 19, "Reading a profile": one training step of the course's GPT under ``torch.profiler``,
its memory over time (``MemoryMeter``), and a DDP step on real gloo ranks whose bucket
all-reduces are found in the trace. Re-exported by ``run.py``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch

from course_lib import kit, validate
from course_lib.measure.profile import StepProfile, profile_step
from course_lib.runtime.launch import launch


@dataclass(frozen=True)
class AllReduceRow:
    """:func:`comm_table`: one all-reduce of one rank's DDP step, hidden and exposed."""

    rank: int
    all_reduce: int
    start_ms: float
    duration_ms: float
    hidden_ms: float
    exposed_ms: float


def gpt_setup(*, batch: int = 8, seed: int = 0) -> tuple[Any, Any, torch.Tensor, torch.Tensor]:
    """The course's tiny GPT (64 wide, 2 layers, 64 tokens), AdamW, and one batch (x, y)."""
    from course_lib.models import GPT, GPTConfig

    batch = validate.count("batch", batch, minimum=1)
    torch.manual_seed(seed)
    cfg = GPTConfig.tiny()
    model = GPT(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, cfg.vocab_size, (batch, cfg.block_size))
    return model, opt, x, torch.roll(x, -1, dims=1)


def gpt_matmul_flops(model, x) -> dict[str, int]:
    """Predicted matmul FLOPs of one training step of ``model`` (the course's GPT) on ``x``
    (batch, seq), from shapes alone (``estimate.gpt_step_matmul_flops``): forward 2 x tokens x
    (weights of every Linear, the tied output head included) plus, per layer, the two attention
    products 2 x 2 x B x H x S^2 x head_dim; backward twice the forward (gradients of the input
    and of the weight)."""
    from course_lib.measure import estimate

    flops = estimate.gpt_step_matmul_flops(model.config, *x.shape)
    return {"forward": flops["forward"], "backward": flops["backward"], "step": flops["total"]}


def _train_step(model, opt, x, y) -> None:
    opt.zero_grad(set_to_none=True)
    model.loss(x, y).backward()
    opt.step()


def gpt_step_profile(
    trace_path: str | os.PathLike[str] | None = None, *, batch: int = 8
) -> StepProfile:
    """One AdamW training step of the tiny GPT under the profiler (after one warm-up step),
    with per-operator memory; the Chrome trace written to ``trace_path`` if given."""
    model, opt, x, y = gpt_setup(batch=batch)
    return profile_step(
        lambda: _train_step(model, opt, x, y), trace_path=trace_path, profile_memory=True
    )


def gpt_step_memory(*, batch: int = 8) -> pd.DataFrame:
    """The same step under ``MemoryMeter``: bytes by category at each module hook (its
    ``timeline``), with ``peak_bytes`` and ``peak_phase`` in ``attrs``."""
    from course_lib.measure.memory import MemoryMeter

    model, opt, x, y = gpt_setup(batch=batch)
    _train_step(model, opt, x, y)  # the optimizer's state exists before the measured step
    with MemoryMeter(model, opt) as mem:
        _train_step(model, opt, x, y)
    df = mem.timeline.copy()
    df.attrs.update(peak_bytes=mem.peak_bytes, peak_phase=mem.peak_phase)
    return df


def _ddp_worker(rank: int, world_size: int, width: int, layers: int, cap_mb: float, trace_dir):
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    ddp = DDP(model, bucket_cap_mb=cap_mb)
    x = torch.randn(4 * width, width, generator=torch.Generator().manual_seed(rank))

    def step() -> None:
        ddp.zero_grad(set_to_none=True)
        ddp(x).square().mean().backward()

    path = None if trace_dir is None else os.path.join(trace_dir, f"ddp_rank{rank}.json")
    prof = profile_step(step, warmup=2, trace_path=path, rank=rank)  # DDP builds buckets in 1
    buckets = len(ddp._get_ddp_logging_data().get("rebuilt_bucket_sizes", "").split(", "))
    return prof, buckets


def ddp_step_profiles(
    world_size: int = 2,
    *,
    width: int = 256,
    layers: int = 6,
    bucket_cap_mb: float = 0.5,
    trace_dir: str | os.PathLike[str] | None = None,
) -> tuple[list[StepProfile], int]:
    """One DDP step (``layers`` Linear(width, width), torch's DDP with ``bucket_cap_mb``) on
    ``world_size`` gloo ranks, profiled on every rank: the profiles in rank order and the
    number of gradient buckets DDP built (its logging data). Trace files
    ``ddp_rank{r}.json`` go to ``trace_dir`` if given."""
    world_size = validate.count("world_size", world_size, minimum=2, maximum=4)
    width = validate.count("width", width, minimum=8)
    layers = validate.count("layers", layers, minimum=1)
    cap = validate.number("bucket_cap_mb", bucket_cap_mb, positive=True)
    where = None if trace_dir is None else os.fspath(trace_dir)
    res = launch(_ddp_worker, world_size, width, layers, cap, where, timeout=120)
    return [r[0] for r in res], res[0][1]


def comm_table(profiles: list[StepProfile]) -> pd.DataFrame:
    """Every all-reduce of every rank's step: rank, index, start and duration (ms from the
    step's start), the part that ran while backward computed on another thread (hidden_ms)
    and the rest (exposed_ms, on the critical path)."""
    rows = []
    for prof in profiles:
        reduces = [s for s in prof.comm() if "all_reduce" in s.name or "allreduce" in s.name]
        for i, s in enumerate(reduces):
            hidden = prof.hidden_us(s)
            us = (s.start_us, s.duration_us, hidden, s.duration_us - hidden)
            rows.append(AllReduceRow(prof.rank, i, *(t / 1e3 for t in us)))
    return kit.frame(rows, AllReduceRow)
