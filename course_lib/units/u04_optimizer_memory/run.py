"""Optimizer memory, measured.

Introduced in notebooks/04_optimizer_memory.ipynb. Measured runs, each returning a pandas DataFrame:

- :func:`state_bytes_table`: the state each optimizer really allocates for the tiny GPT (read from
  ``optimizer.state`` and from MemoryMeter) beside ``estimate.model_state_bytes`` (and, for 8-bit
  Adam, ``estimate.adam8bit_state_bytes``);
- :func:`mixed_precision_accounting`: the classic recipe (bf16 model + fp32 master + Adam) measured
  per parameter: 16 bytes at rest, more during the step (the fp32 gradients);
- :func:`recipe_table`: the 16-byte recipe (fp32 master) beside the 12-byte one (bf16 weights,
  fp32 Adam moments, no master) and the 8-byte bf16-true one: bytes per parameter measured at rest,
  and what each does to small updates (the same steps as an fp32 run, compared with it);
- :func:`accounting_table`: the 12 / 16 / 18 / 20 bytes-per-parameter figures of the literature,
  each from its components (bytes from ``estimate.dtype_bytes``) and its source;
- :func:`convergence`: every optimizer on the same task, same seed, same batches.

Plain data out; plots in course_lib.units.u04_optimizer_memory.plots.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import pandas as pd
import torch

from course_lib import validate
from course_lib.data import permutation_batch
from course_lib.measure import estimate
from course_lib.models import GPT, GPTConfig, count_params
from course_lib.techniques import optim as O
from course_lib.units.u04_optimizer_memory.run_accounting import (  # noqa: F401 (re-exported)
    ACCOUNTINGS,
    accounting_table,
)

__all__ = [
    "DEFAULT_LR",
    "state_bytes_table",
    "mixed_precision_accounting",
    "RECIPES",
    "recipe_table",
    "ACCOUNTINGS",
    "accounting_table",
    "convergence",
    "task_batch",
]

#: learning rates for the tiny GPT on the task: the best of a small grid (3-4 values each, 30 steps,
#: batch 8, seq 16) -- SGD needs a far larger one than the adaptive methods
DEFAULT_LR: dict[str, float] = {
    "sgd": 0.2,
    "momentum": 0.1,
    "rmsprop": 1e-3,
    "adagrad": 1e-2,
    "adam": 1e-2,
    "adamw": 1e-2,
    "adam8bit": 1e-2,
}


def task_batch(
    config: GPTConfig, batch: int, seq: int, *, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """The learnable sequence task of unit 03: :func:`course_lib.data.permutation_batch` (a fixed
    random permutation of the vocabulary)."""
    return permutation_batch(config, batch, seq, generator=generator)


def _model(config: GPTConfig, seed: int) -> GPT:
    torch.manual_seed(seed)
    return GPT(config)


# --------------------------------------------------------------------------------------------
# state bytes per optimizer
# --------------------------------------------------------------------------------------------
def state_bytes_table(
    names: Sequence[str] = O.OPTIMIZERS,
    *,
    config: GPTConfig | None = None,
    batch: int = 4,
    seq: int | None = None,
    seed: int = 0,
) -> pd.DataFrame:
    """Optimizer state of the tiny GPT after one step, per optimizer (``seq`` defaults to
    min(32, block_size): the state does not depend on it).

    Columns: ``n_params``; ``naive`` = ``estimate.model_state_bytes(...)["optimizer"]`` (bytes per
    parameter times n, plus torch.optim's 4-byte ``step`` counters: 2 bytes per parameter for
    8-bit Adam); ``predicted`` = ``naive`` for the torch.optim optimizers and
    ``estimate.adam8bit_state_bytes(...)["total"]`` for 8-bit Adam (bitsandbytes' exact rules:
    fp32 state for small tensors, per-block absmax, shared code books); ``measured`` =
    MemoryMeter's *optimizer* bytes at the end of a step; ``moments`` / ``step`` / ``quant_meta``
    from :func:`course_lib.techniques.optim.state_bytes`; ``bytes_per_param`` = measured /
    n_params; ``residual`` = measured - predicted.
    """
    from course_lib.measure.memory import MemoryMeter

    config = config or GPTConfig.tiny()
    seq = min(32, config.block_size) if seq is None else seq
    rows = []
    for name in validate.choices("names", names, O.OPTIMIZERS):
        model = _model(config, seed)
        opt = O.make_optimizer(name, model.parameters(), lr=DEFAULT_LR[name])
        idx, tgt = task_batch(config, batch, seq, generator=torch.Generator().manual_seed(seed))
        with MemoryMeter(model, opt) as mem:
            opt.zero_grad(set_to_none=True)
            model.loss(idx, tgt).backward()
            opt.step()
        n = count_params(model)
        with_grad = [p for p in model.parameters() if p.grad is not None]  # the ones with state
        naive = int(
            estimate.model_state_bytes(
                n, precision="fp32", optimizer=name, n_param_tensors=len(with_grad)
            )["optimizer"]
        )
        pred = (
            estimate.adam8bit_state_bytes(p.numel() for p in with_grad)["total"]
            if name == "adam8bit"
            else naive
        )
        sb = O.state_bytes(opt)
        measured = int(mem.end_breakdown["optimizer"])
        rows.append(
            {
                "optimizer": name,
                "n_params": n,
                "naive": naive,
                "predicted": int(pred),
                "measured": measured,
                "residual": measured - int(pred),
                **{k: sb[k] for k in ("moments", "step", "quant_meta")},
                "state_total": sb["total"],
                "bytes_per_param": measured / n,
                "predicted_per_param": estimate.optimizer_state_bytes_per_param(name),
            }
        )
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------------------------
# mixed-precision Adam, measured per parameter
# --------------------------------------------------------------------------------------------
def _per_param_row(
    label: str, bd: Mapping[str, int], buffers: int, n: int
) -> dict[str, str | float]:
    """A MemoryMeter breakdown as bytes per parameter, by component of the master recipe."""
    return {
        "when": label,
        "params (16-bit)": (bd["params"] - buffers) / n,
        "grads (16-bit)": bd["grads"] / n,
        "master (fp32)": bd["other"] / n,
        "adam m, v (fp32)": bd["optimizer"] / n,
        "fp32 grads + scratch": (bd["activations"] + bd["temporaries"]) / n,
        "total": (sum(bd.values()) - buffers) / n,
    }


def mixed_precision_accounting(
    *,
    config: GPTConfig | None = None,
    batch: int = 4,
    seq: int = 32,
    seed: int = 0,
    dtype: torch.dtype = torch.bfloat16,
) -> pd.DataFrame:
    """The classic recipe (16-bit model, fp32 master weights, Adam on the master) measured with
    MemoryMeter around one optimizer step: rows ``at rest`` (after the step) and ``during step``
    (MemoryMeter's peak inside ``step()``), bytes per parameter by component, beside the
    ZeRO accounting of ``estimate.model_state_bytes(precision="bf16-mixed", optimizer="adam")``.
    """
    from course_lib.measure.memory import MemoryMeter

    config = config or GPTConfig.tiny()
    model = _model(config, seed).to(dtype)
    mw = O.MasterWeights(model, "adam", lr=1e-3)
    idx, tgt = task_batch(config, batch, seq, generator=torch.Generator().manual_seed(seed))
    for _ in range(2):  # the first step creates the Adam state
        mw.zero_grad()
        model.loss(idx, tgt).backward()
        if _ == 1:
            with MemoryMeter(model, mw.optimizer, track=mw.master) as mem:
                mw.step()
        else:
            mw.step()
    n = count_params(model)
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    pred = estimate.model_state_bytes(
        n, precision="bf16-mixed", optimizer="adam", n_param_tensors=len(mw.master)
    )
    predicted = {
        "when": "predicted (ZeRO accounting)",
        "params (16-bit)": pred["params"] / n,
        "grads (16-bit)": pred["grads"] / n,
        "master (fp32)": pred["master"] / n,
        "adam m, v (fp32)": pred["optimizer"] / n,
        "fp32 grads + scratch": 0.0,
        "total": pred["total"] / n,
    }
    return pd.DataFrame(
        [
            predicted,
            _per_param_row("measured at rest", mem.end_breakdown, buffers, n),
            _per_param_row("measured peak during step", mem.peak_breakdown, buffers, n),
        ]
    ).set_index("when")


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
        idx, tgt = task_batch(config, batch, seq, generator=gen)
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
        rows.append(
            {
                "recipe": recipe,
                "stores": stores,
                "predicted B/param": pred / n,
                "measured B/param": measured,
                "loss": loss,
                "unchanged by last step": unchanged,
                "update error": num / den,
            }
        )
    return pd.DataFrame(rows).set_index("recipe")


# --------------------------------------------------------------------------------------------
# convergence
# --------------------------------------------------------------------------------------------
def convergence(
    names: Sequence[str] = O.OPTIMIZERS,
    *,
    steps: int = 40,
    config: GPTConfig | None = None,
    batch: int = 8,
    seq: int = 16,
    seed: int = 0,
    lr: Mapping[str, float] | None = None,
) -> pd.DataFrame:
    """Train the tiny GPT on the task with each optimizer: same initial weights (seed), same
    batches. Rows: optimizer, lr, step, loss. ``lr`` overrides :data:`DEFAULT_LR` per name."""
    steps = validate.count("steps", steps, minimum=1)
    config = config or GPTConfig.tiny()
    lrs = {**DEFAULT_LR, **(lr or {})}
    rows = []
    for name in validate.choices("names", names, O.OPTIMIZERS):
        model = _model(config, seed)
        opt = O.make_optimizer(name, model.parameters(), lr=lrs[name])
        gen = torch.Generator().manual_seed(seed + 1)
        for step in range(steps):
            idx, tgt = task_batch(config, batch, seq, generator=gen)
            opt.zero_grad(set_to_none=True)
            loss = model.loss(idx, tgt)
            loss.backward()
            opt.step()
            rows.append(
                {"optimizer": name, "lr": lrs[name], "step": step, "loss": float(loss.detach())}
            )
    return pd.DataFrame(rows)
