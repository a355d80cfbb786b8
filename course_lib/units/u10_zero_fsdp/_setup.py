"""Unit 10's shared setup: the models and batches every run trains, and small helpers."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import pandas as pd
import torch
from torch import nn

if TYPE_CHECKING:
    from course_lib.models import MLP
    from course_lib.parallel.harness import Stepper, Which

LR = 1e-2  #: AdamW learning rate of every run


MEMORY_WIDTH = 250  #: hidden width of the memory and traffic model (units of 2,250 / 31,375 / 378)


def model_fn(
    seed: int = 0,
    *,
    width: int = 32,
    depth: int = 2,
    out: int = 2,
    dtype: torch.dtype = torch.float64,
    taper: bool = True,
) -> MLP:
    """An MLP 8 -> width -> width/2 (-> width/2 ...) -> out with ``depth`` hidden layers (float64
    by default: Adam magnifies rounding noise, see parallel/harness/compare.py); ``taper=False``:
    every hidden layer ``width`` wide."""
    from course_lib.models import MLP, MLPConfig

    torch.manual_seed(seed)
    hidden = (width,) + (width // 2 if taper else width,) * (depth - 1)
    return MLP(MLPConfig(in_features=8, hidden=hidden, out_features=out)).to(dtype)


def batch_fn(
    step: int, *, rows: int = 24, out: int = 2, dtype: torch.dtype = torch.float64
) -> tuple[torch.Tensor, torch.Tensor]:
    """The full batch of step ``step`` (24 rows: divisible by 1, 2, 3 and 4 ranks)."""
    from course_lib.data import regression_task

    x, y = regression_task(rows, 8, out, seed=step)
    return x.to(dtype), y.to(dtype)


def _memory_model(seed: int = 0) -> MLP:
    return model_fn(seed, width=MEMORY_WIDTH, out=3, dtype=torch.float32)


def _memory_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    return batch_fn(step, out=3, dtype=torch.float32)


def units_of(model: nn.Module) -> list[list[int]]:
    """The element counts of the parameter tensors of each unit (module owning parameters), the
    ``units`` argument of ``estimate.zero_layout_bytes_per_rank``."""
    return [
        [p.numel() for p in m.parameters(recurse=False)]
        for m in model.modules()
        if any(True for _ in m.parameters(recurse=False))
    ]


def _adamw(model: nn.Module) -> torch.optim.AdamW:
    return torch.optim.AdamW(model.parameters(), lr=LR)


def _self(model: nn.Module) -> Stepper:  # ZeroDataParallel is its own optimizer
    return cast("Stepper", model)


def _zero_full_tensors(model: nn.Module, which: Which = "param") -> dict[str, torch.Tensor]:
    """``parallel.zero.full_tensors`` as the harness's ``gather_fn`` (it checks the model is a
    ZeroDataParallel)."""
    from course_lib.parallel.zero import ZeroDataParallel, full_tensors

    return full_tensors(cast(ZeroDataParallel, model), which)


def _summary(table: pd.DataFrame) -> tuple[int, int, float, bool]:
    """comparisons, failed, worst (max |difference| / tolerance) and ok of a harness table."""
    worst = float((table.max_abs_diff / table.tolerance).max())
    return len(table), int((~table.ok).sum()), worst, bool(table.ok.all())
