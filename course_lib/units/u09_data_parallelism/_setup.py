"""Unit 09's model and batches: what every data-parallel run of :mod:`run` trains.

Used through :mod:`run` (which re-exports ``model_fn`` and ``batch_fn``) and the checks.
"""

from __future__ import annotations

import torch
from torch import nn


def model_fn(seed: int = 0, *, width: int = 32, dtype: torch.dtype = torch.float64) -> nn.Module:
    """The parity model: MLP 8 -> width -> width/2 -> 2 (float64 by default: Adam magnifies the
    rounding noise of near-zero gradients, see parallel/harness/compare.py)."""
    from course_lib.models import MLP, MLPConfig

    torch.manual_seed(seed)
    return MLP(MLPConfig(in_features=8, hidden=(width, width // 2), out_features=2)).to(dtype)


def batch_fn(
    step: int, *, rows: int = 24, dtype: torch.dtype = torch.float64
) -> tuple[torch.Tensor, torch.Tensor]:
    """The full batch of step ``step`` (a regression task; 24 rows: divisible by 1, 2, 3, 4)."""
    from course_lib.data import regression_task

    x, y = regression_task(rows, 8, 2, seed=step)
    return x.to(dtype), y.to(dtype)


def _n_bytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
