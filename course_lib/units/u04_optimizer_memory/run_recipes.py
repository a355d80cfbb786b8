"""Unit 04, 16 or 12 bytes per parameter: the master copy measured, recipe by recipe.

Used by notebooks/04_optimizer_memory.ipynb through :mod:`run` (which re-exports these names).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import pandas as pd
import torch

from course_lib import kit, validate
from course_lib.data import permutation_batch
from course_lib.measure import estimate
from course_lib.models import GPT, GPTConfig, count_params
from course_lib.techniques import optim as O


@dataclass(frozen=True)
class RecipeRow:
    """One storage recipe of :func:`recipe_table`: bytes per parameter and small updates."""

    recipe: str
    stores: str
    predicted: float = field(metadata=kit.column("predicted B/param"))
    measured: float = field(metadata=kit.column("measured B/param"))
    loss: float
    unchanged: float = field(metadata=kit.column("unchanged by last step"))
    update_error: float = field(metadata=kit.column("update error"))


def _model(config: GPTConfig, seed: int) -> GPT:
    """The tiny GPT every run of the unit starts from: ``GPT(config)`` after ``manual_seed(seed)``."""
    torch.manual_seed(seed)
    return GPT(config)


# --------------------------------------------------------------------------------------------
# 16 or 12 bytes per parameter: the master copy, measured
# --------------------------------------------------------------------------------------------
#: recipe -> (what it stores, estimate.model_state_bytes arguments)
RECIPES: dict[str, tuple[str, dict[str, Any]]] = {
    "fp32": ("fp32 params, grads, Adam m and v", dict(precision="fp32")),
    "16 B: bf16 + fp32 master": (
        "bf16 params and grads, fp32 master, fp32 Adam m and v",
        dict(precision="bf16-mixed"),
    ),
    "12 B: bf16, fp32 moments": (
        "bf16 params and grads, fp32 Adam m and v, no master",
        dict(precision="bf16-true", state_dtype_bytes=4),
    ),
    "8 B: bf16-true": ("bf16 params, grads, Adam m and v", dict(precision="bf16-true")),
}


class _Stepper:
    """One recipe's optimizer behind one interface: zero_grad(), step(), the tensors it holds."""

    def __init__(self, recipe: str, model: torch.nn.Module, lr: float) -> None:
        self.master: Sequence[torch.Tensor] = ()
        self._mw: O.MasterWeights | None
        self.optimizer: torch.optim.Optimizer
        if recipe == "16 B: bf16 + fp32 master":
            self._mw = O.MasterWeights(model, "adam", lr=lr)
            self.optimizer, self.master = self._mw.optimizer, self._mw.master
        elif recipe == "12 B: bf16, fp32 moments":
            self._mw = None
            self.optimizer = O.Adam(model.parameters(), lr=lr, state_dtype=torch.float32)
        else:
            self._mw = None
            self.optimizer = torch.optim.Adam(model.parameters(), lr=lr)

    def zero_grad(self) -> None:
        (self._mw or self.optimizer).zero_grad(set_to_none=True)

    def step(self) -> None:
        (self._mw or self.optimizer).step()


def _train_recipe(
    model: GPT,
    stepper: _Stepper,
    config: GPTConfig,
    batch: int,
    seq: int,
    steps: int,
    seed: int,
) -> tuple[float, float, float]:
    """``steps`` steps of one recipe: (last loss, model-state B/param measured over the second
    step's optimizer step, share of weights the last step left unchanged)."""
    from course_lib.measure.memory import MemoryMeter

    gen = torch.Generator().manual_seed(seed + 1)
    n = count_params(model)
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    measured = math.nan
    for step in range(steps):
        idx, tgt = permutation_batch(config, batch, seq, generator=gen)
        stepper.zero_grad()
        loss = model.loss(idx, tgt)
        loss.backward()
        before = [p.detach().clone() for p in model.parameters()]
        if step == 1:
            with MemoryMeter(model, stepper.optimizer, track=stepper.master) as mem:
                stepper.step()
            end = mem.end_breakdown
            measured = (
                end["params"] - buffers + end["grads"] + end["optimizer"] + end["other"]
            ) / n
        else:
            stepper.step()
    unchanged = sum(int((p.detach() == b).sum()) for p, b in zip(model.parameters(), before)) / n
    return float(loss.detach()), measured, unchanged


def recipe_table(
    *,
    config: GPTConfig | None = None,
    batch: int = 4,
    seq: int = 32,
    steps: int = 20,
    lr: float = 1e-4,
    seed: int = 0,
) -> pd.DataFrame:
    """Each recipe of :data:`RECIPES` on the tiny GPT, from the same initial weights (the fp32
    ones, rounded to bf16 for the 16-bit recipes) on the same batches.

    Columns: ``stores``; ``predicted B/param`` (``estimate.model_state_bytes`` with the recipe's
    arguments and the step counters it keeps); ``measured B/param`` (MemoryMeter at the end of the
    second step: params without buffers + grads + optimizer state + master); after ``steps`` steps at
    ``lr``: ``loss``, ``unchanged by last step`` (share of 16-bit weights the last step left exactly
    as they were) and ``update error`` = ||w - w_fp32|| / ||w_fp32 - w_0||, the error of the total
    update against the fp32 run (0 = the same update, 1 = as far off as the update itself).
    """
    config = config or GPTConfig.tiny()
    validate.number("lr", lr, positive=True)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 2:
        raise ValueError(f"steps = {steps!r}: expected an int >= 2 (the second step is measured)")
    rows = []
    fp32_final: list[torch.Tensor] = []  # RECIPES starts with fp32: set on the first recipe
    start: list[torch.Tensor] = []
    for recipe, (stores, kwargs) in RECIPES.items():
        model = _model(config, seed)
        if recipe != "fp32":
            model = model.to(torch.bfloat16)
        w0 = [p.detach().float().clone() for p in model.parameters()]
        start = start or w0
        stepper = _Stepper(recipe, model, lr)
        n = count_params(model)
        loss, measured, unchanged = _train_recipe(model, stepper, config, batch, seq, steps, seed)
        final = [p.detach().float() for p in model.parameters()]
        if recipe == "fp32":
            fp32_final = final
        num = sum(float((f - r).pow(2).sum()) for f, r in zip(final, fp32_final)) ** 0.5
        den = sum(float((r - s).pow(2).sum()) for r, s in zip(fp32_final, start)) ** 0.5
        # torch.optim.Adam keeps one step counter tensor per parameter; O.Adam a Python int
        n_counters = len(w0) if isinstance(stepper.optimizer, torch.optim.Adam) else 0
        pred = estimate.model_state_bytes(
            n, optimizer="adam", n_param_tensors=n_counters, **kwargs
        )["total"]
        rows.append(RecipeRow(recipe, stores, pred / n, measured, loss, unchanged, num / den))
    return kit.frame(rows, RecipeRow).set_index("recipe")
