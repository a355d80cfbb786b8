"""Unit 05's shared setup: the model every run trains, with and without offload, and its optimizer."""

from __future__ import annotations

import torch

from course_lib.models import GPT, GPTConfig
from course_lib.techniques.offload import PHASES
from course_lib.techniques.optim import MasterWeights

#: the model of the unit: a tiny GPT wide enough that its optimizer state outweighs activations
CONFIG = GPTConfig.tiny(n_layer=2, n_embd=128, block_size=32)


LR = 1e-2


#: the parts of an offloaded step, in order: the caller's forward + backward, then OffloadAdamW's
PARTS = ("compute", *PHASES)


def _models(
    config: GPTConfig, dtype: torch.dtype, device: str | torch.device, seed: int = 0
) -> list[GPT]:
    out = []
    for _ in range(2):
        torch.manual_seed(seed)
        out.append(GPT(config).to(device, dtype))
    return out


def _plain_optimizer(
    model: torch.nn.Module, dtype: torch.dtype
) -> torch.optim.Optimizer | MasterWeights:
    """The plain recipe: torch.optim.AdamW on fp32 parameters, unit 04's master weights on 16-bit."""
    if dtype == torch.float32:
        return torch.optim.AdamW(model.parameters(), lr=LR, foreach=False)
    return MasterWeights(model, "adamw", lr=LR, foreach=False)
