"""Unit 17's shared setup: the GPT every section uses and its batches."""

from __future__ import annotations

import torch

from course_lib.data import permutation_batch
from course_lib.models import GPT, GPTConfig

#: the unit's GPT: width 128 so FP8 tiles divide it; no biases and an untied head, as in
#: Llama-style models (the FSDP section then gathers pure weight matrices)
CONFIG = GPTConfig.tiny(n_embd=128, n_head=4, block_size=32, bias=False, tie_weights=False)

#: tile width of blockwise scaling in this unit: DeepSeek-V3 uses 128 on a 7168-wide model; on
#: our 128-wide one a 1 x 32 tile keeps four tiles per row (1 x 128 would be rowwise)
BLOCK = 32

#: sequences per batch: 4 x 32 = 128 tokens, a multiple of the tile (the weight-gradient GEMM
#: contracts over the tokens)
BATCH = 4


def model_fn(seed: int = 0, *, config: GPTConfig = CONFIG) -> GPT:
    """The unit's GPT, fp32, built the same everywhere from ``seed``."""
    torch.manual_seed(seed)
    return GPT(config)


def batch_fn(
    generator: torch.Generator, *, config: GPTConfig = CONFIG, batch: int = BATCH
) -> tuple[torch.Tensor, torch.Tensor]:
    """The next batch of the permutation task (``course_lib.data.permutation_batch``)."""
    return permutation_batch(config, batch, config.block_size, generator=generator)
