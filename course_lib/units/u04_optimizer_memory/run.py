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

from dataclasses import dataclass, field
from typing import Mapping, Sequence

import pandas as pd
import torch

from course_lib import kit, validate
from course_lib.data import permutation_batch
from course_lib.measure import estimate
from course_lib.measure.estimate.memory import Optimizer
from course_lib.models import GPT, GPTConfig, count_params
from course_lib.techniques import optim as O
from course_lib.units.u04_optimizer_memory.run_accounting import (  # noqa: F401 (re-exported)
    ACCOUNTINGS,
    accounting_table,
)
from course_lib.units.u04_optimizer_memory.run_recipes import (  # noqa: F401 (re-exported)
    RECIPES,
    RecipeRow,
    _model,
    recipe_table,
)

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


@dataclass(frozen=True)
class StateRow:
    """One optimizer's state after one step of the tiny GPT (:func:`state_bytes_table`)."""

    optimizer: str
    n_params: int
    naive: int
    predicted: int
    measured: int
    residual: int
    moments: int
    step: int
    quant_meta: int
    state_total: int
    bytes_per_param: float
    predicted_per_param: float


@dataclass(frozen=True)
class PerParamRow:
    """Bytes per parameter by component of the master-weights recipe, predicted or measured."""

    when: str
    params: float = field(metadata=kit.column("params (16-bit)"))
    grads: float = field(metadata=kit.column("grads (16-bit)"))
    master: float = field(metadata=kit.column("master (fp32)"))
    adam: float = field(metadata=kit.column("adam m, v (fp32)"))
    scratch: float = field(metadata=kit.column("fp32 grads + scratch"))
    total: float


@dataclass(frozen=True)
class ConvergenceRow:
    """The loss of one optimizer at one step (:func:`convergence`)."""

    optimizer: str
    lr: float
    step: int
    loss: float


# --------------------------------------------------------------------------------------------
# state bytes per optimizer
# --------------------------------------------------------------------------------------------
def _state_row(name: Optimizer, model: GPT, opt: torch.optim.Optimizer, measured: int) -> StateRow:
    """The estimates beside the ``measured`` optimizer bytes after one step of ``opt``."""
    n = count_params(model)
    with_grad = [p for p in model.parameters() if p.grad is not None]  # the ones with state
    state = estimate.model_state_bytes(
        n, precision="fp32", optimizer=name, n_param_tensors=len(with_grad)
    )
    naive = pred = int(state["optimizer"])
    if name == "adam8bit":
        pred = int(estimate.adam8bit_state_bytes(p.numel() for p in with_grad)["total"])
    sb = O.state_bytes(opt)
    return StateRow(
        name,
        n,
        naive,
        pred,
        measured,
        measured - pred,
        sb["moments"],
        sb["step"],
        sb["quant_meta"],
        sb["total"],
        measured / n,
        estimate.optimizer_state_bytes_per_param(name),
    )


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
        idx, tgt = permutation_batch(
            config, batch, seq, generator=torch.Generator().manual_seed(seed)
        )
        with MemoryMeter(model, opt) as mem:
            opt.zero_grad(set_to_none=True)
            model.loss(idx, tgt).backward()
            opt.step()
        rows.append(_state_row(name, model, opt, int(mem.end_breakdown["optimizer"])))
    return kit.frame(rows, StateRow)


# --------------------------------------------------------------------------------------------
# mixed-precision Adam, measured per parameter
# --------------------------------------------------------------------------------------------
def _per_param_row(label: str, bd: Mapping[str, int], buffers: int, n: int) -> PerParamRow:
    """A MemoryMeter breakdown as bytes per parameter, by component of the master recipe."""
    return PerParamRow(
        label,
        (bd["params"] - buffers) / n,
        bd["grads"] / n,
        bd["other"] / n,
        bd["optimizer"] / n,
        (bd["activations"] + bd["temporaries"]) / n,
        (sum(bd.values()) - buffers) / n,
    )


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
    idx, tgt = permutation_batch(config, batch, seq, generator=torch.Generator().manual_seed(seed))
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
    predicted = PerParamRow(
        "predicted (ZeRO accounting)",
        pred["params"] / n,
        pred["grads"] / n,
        pred["master"] / n,
        pred["optimizer"] / n,
        0.0,
        pred["total"] / n,
    )
    rows = [
        predicted,
        _per_param_row("measured at rest", mem.end_breakdown, buffers, n),
        _per_param_row("measured peak during step", mem.peak_breakdown, buffers, n),
    ]
    return kit.frame(rows, PerParamRow).set_index("when")


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
            idx, tgt = permutation_batch(config, batch, seq, generator=gen)
            opt.zero_grad(set_to_none=True)
            loss = model.loss(idx, tgt)
            loss.backward()
            opt.step()
            rows.append(ConvergenceRow(name, lrs[name], step, float(loss.detach())))
    return kit.frame(rows, ConvergenceRow)
