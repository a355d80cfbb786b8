"""Unit 11's shared setup: the tiny GPT every run shards, its batches, and the TP degree check."""

from __future__ import annotations

from typing import Any

import torch

from course_lib.models import GPT, GPTConfig
from course_lib.parallel import harness as H
from course_lib.parallel.tensor import check_tp

#: the tiny GPT of this unit: 2 layers, 4 heads, width 64, sequence 16 (splits over 1, 2, 4)
CONFIG = GPTConfig.tiny(n_layer=2, block_size=16)


BATCH = 4


def model_fn(
    seed: int = 0, *, config: GPTConfig = CONFIG, dtype: torch.dtype = torch.float32
) -> GPT:
    """The tiny GPT, built the same in every process from ``seed``."""
    torch.manual_seed(seed)
    return GPT(config).to(dtype)


def batch_fn(
    step: int, *, config: GPTConfig = CONFIG, batch: int = BATCH
) -> tuple[torch.Tensor, torch.Tensor]:
    """Next-token batch of step ``step``: random token ids and the same ids shifted by one."""
    gen = torch.Generator().manual_seed(1000 + step)
    x = torch.randint(0, config.vocab_size, (batch, config.block_size), generator=gen)
    return x, torch.roll(x, -1, dims=1)


def _check(
    tp: int,
    config: GPTConfig = CONFIG,
    *,
    world_size: int | None = None,
    sequence_parallel: bool = False,
) -> int:
    return check_tp(config, tp, world_size=world_size, sequence_parallel=sequence_parallel)


def _step_fn(model: torch.nn.Module, batch: Any) -> torch.Tensor:
    from course_lib.parallel.tensor import sync_sequence_parallel_grads

    loss = H.cross_entropy_loss(model, batch)
    loss.backward()
    sync_sequence_parallel_grads(model)  # nothing to do without sequence parallelism
    return loss
