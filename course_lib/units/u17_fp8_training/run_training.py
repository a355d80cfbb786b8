"""Unit 17, over many steps: the GPT trained in fp32, bf16 and each FP8 recipe, and delayed
scaling against a spike.

Used by notebooks/17_fp8_training.ipynb through :mod:`run` (which re-exports these names).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pandas as pd
import torch

from course_lib import kit, validate
from course_lib.techniques.fp8 import relative_error
from course_lib.techniques.fp8_linear import RECIPES, Float8Linear, convert_to_float8
from course_lib.units.u17_fp8_training._setup import BLOCK, batch_fn, model_fn

#: what :func:`train_curves` can train: full precision, bf16 autocast, each FP8 recipe
PRECISIONS = ("fp32", "bf16", *RECIPES)


@dataclass(frozen=True)
class CurveRow:
    """:func:`train_curves`: one step's loss in one precision."""

    precision: str
    step: int
    loss: float


@dataclass(frozen=True)
class SpikeRow:
    """:func:`delayed_spike`: one step's forward error and saturated inputs under one scaling."""

    step: int
    scaling: str
    output_error: float = field(metadata=kit.column("output error"))
    saturated: int = field(metadata=kit.column("saturated inputs"))


def _train_one(precision: str, *, steps: int, lr: float, seed: int) -> list[CurveRow]:
    model = model_fn(seed)
    if precision in RECIPES:
        convert_to_float8(model, recipe=precision, block=BLOCK)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(seed + 1)
    rows = []
    with kit.one_thread():
        for step in range(steps):
            idx, tgt = batch_fn(gen)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
                loss = model.loss(idx, tgt)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            rows.append(CurveRow(precision, step, float(loss.detach())))
    return rows


def train_curves(
    precisions: Sequence[str] = PRECISIONS, *, steps: int = 30, lr: float = 3e-3, seed: int = 0
) -> pd.DataFrame:
    """Train the unit's GPT from the same seed on the same batches in each precision: fp32, bf16
    autocast, and each FP8 recipe on every linear layer but the output head (``"unscaled"``:
    E4M3 everywhere with a scale of 1). Rows: precision, step, loss."""
    steps = validate.count("steps", steps, minimum=1)
    lr = validate.number("lr", lr, positive=True)
    names = validate.choices("precisions", precisions, PRECISIONS)
    rows = [r for p in names for r in _train_one(p, steps=steps, lr=lr, seed=seed)]
    return kit.frame(rows, CurveRow)


def curve_summary(df: pd.DataFrame, *, last: int = 5) -> pd.DataFrame:
    """Per precision: final loss (mean of the ``last`` steps) and its gap to fp32's, absolute and
    in percent (needs an fp32 run in ``df``)."""
    out = df.groupby("precision", sort=False)["loss"].agg(
        final=lambda s: float(s.tail(last).mean())
    )
    out = out.reset_index()
    base = float(out.loc[out.precision == "fp32", "final"].iloc[0])
    out["gap to fp32"] = out["final"] - base
    out["gap %"] = 100 * out["gap to fp32"] / base
    return out


def delayed_spike(
    *, steps: int = 30, spike_at: int = 10, factor: float = 20.0, history: int = 16, seed: int = 0
) -> pd.DataFrame:
    """One linear layer (128 -> 512) fed a fresh normal input each step, ``factor`` x larger at
    step ``spike_at``: per step, the forward relative error against fp32 and the input values
    saturated (clamped to 448 x scale) under current tensorwise scaling and under delayed scaling
    with an amax history of ``history`` steps."""
    from dataclasses import replace

    steps = validate.count("steps", steps, minimum=1)
    spike_at = validate.count("spike_at", spike_at, maximum=steps - 1)
    torch.manual_seed(seed)
    lin = torch.nn.Linear(128, 512, bias=False)
    delayed = Float8Linear.from_linear(
        lin,
        recipe=replace(RECIPES["delayed"], history=validate.count("history", history, minimum=1)),
    )
    current = Float8Linear.from_linear(lin, recipe="tensorwise")
    gen = torch.Generator().manual_seed(seed + 1)
    rows = []
    with torch.no_grad(), kit.one_thread():
        for step in range(steps):
            x = torch.randn(64, 128, generator=gen) * (factor if step == spike_at else 1.0)
            ref = lin(x)
            for name, layer in (
                ("current (tensorwise)", current),
                (f"delayed ({history} steps)", delayed),
            ):
                error = relative_error(layer(x), ref)  # the call counts what it saturated
                saturated = layer.saturated["input"] if layer is delayed else 0
                rows.append(SpikeRow(step, name, error, saturated))
    return kit.frame(rows, SpikeRow)
