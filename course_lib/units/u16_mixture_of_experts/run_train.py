"""Unit 16, one process: an MoE layer trained on a small task, to show router collapse,
the two balancing methods and what the capacity factor drops (``unit.run.train``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch

from course_lib import kit, validate
from course_lib.parallel import experts as X

__all__ = ["BALANCING", "TrainRow", "train"]

#: how the router is kept balanced: nothing, Switch's auxiliary loss, DeepSeek-V3's bias
BALANCING = ("none", "aux_loss", "bias")
_D, _F, _E, _CLUSTERS = 16, 32, 4, 8
_OFFSET = torch.full((_D,), 0.75)  # what every token has in common


@dataclass(frozen=True)
class TrainRow:
    """:func:`train`: one step of one balancing method at one capacity factor."""

    balancing: str
    capacity_factor: float | None
    step: int
    task_loss: float
    aux_loss: float
    busiest_share: float
    dropped: float


def _task(steps: int, batch: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens from 8 clusters; the target is a cluster-specific linear map of the token."""
    g = torch.Generator().manual_seed(16 + seed)
    centres = _OFFSET + torch.randn(_CLUSTERS, _D, generator=g)  # all share one direction
    maps = torch.randn(_CLUSTERS, _D, _D, generator=g) / _D**0.5
    c = torch.randint(0, _CLUSTERS, (steps, batch), generator=g)
    x = centres[c] + torch.randn(steps, batch, _D, generator=g)  # (steps, batch, D)
    y = torch.einsum("sbi,sbij->sbj", x, maps[c])  # (steps, batch, D)
    return x, y


def _run(
    balancing: str,
    capacity_factor: float | None,
    top_k: int,
    steps: int,
    batch: int,
    loss: Any,
    seed: int,
) -> list[TrainRow]:
    torch.manual_seed(seed)
    router: X.Router = "sigmoid" if balancing == "bias" else "softmax"
    moe = X.MoE(_D, _F, _E, top_k, capacity_factor=capacity_factor, router=router)
    with torch.no_grad():  # a router that starts out liking expert 0 a little more
        moe.router.weight[0] += 0.5 * _OFFSET / _OFFSET.norm()
    opt = torch.optim.Adam(moe.parameters(), lr=3e-3)
    xs, ys = _task(steps, batch, seed)
    rows = []
    for step in range(steps):
        y, aux = moe(xs[step])
        r = moe.last_routing
        assert r is not None
        if loss is not None:  # a balancing loss written elsewhere (the exercise's)
            aux = loss(r.probs, r.experts)
        task = torch.nn.functional.mse_loss(y, ys[step])
        total = task + (0.05 * aux if balancing == "aux_loss" else 0)
        opt.zero_grad()
        total.backward()
        opt.step()
        load = torch.bincount(r.experts.reshape(-1), minlength=_E).float() / r.experts.numel()
        if balancing == "bias":
            with torch.no_grad():
                X.update_bias(moe.bias, r.experts, 1e-2)
        dropped = float(1 - r.keep.float().mean())
        row = (step, float(task.detach()), float(aux.detach()), float(load.max()), dropped)
        rows.append(TrainRow(balancing, capacity_factor, *row))
    return rows


def train(
    balancing: Sequence[str] = BALANCING,
    *,
    capacity_factors: Sequence[float | None] = (None,),
    top_k: int = 1,
    steps: int = 150,
    batch: int = 64,
    loss: Any = None,
    seed: int = 0,
) -> pd.DataFrame:
    """Train one MoE layer (16 wide, 4 experts of 32, top ``top_k``) with Adam on a synthetic
    regression task (8 clusters of tokens, each with its own linear map) for each balancing
    method and capacity factor. One row per (balancing, capacity_factor, step): the task loss
    (MSE), the balancing loss, the busiest expert's share of the assignments (1/4 = even, 1 =
    collapsed) and the share of assignments dropped. ``loss(probs, experts)``: use this
    balancing loss instead of the course's (with "aux_loss"). ``seed`` draws the initial
    weights and the task's tokens (0: the lecture's first run). Measured, one process."""
    names = validate.choices("balancing", balancing, BALANCING)
    k = validate.count("top_k", top_k, minimum=1, maximum=_E)
    n = validate.count("steps", steps, minimum=1)
    b = validate.count("batch", batch, minimum=1)
    seed = validate.count("seed", seed, minimum=0)
    cfs = [None if c is None else validate.number("capacity_factors", c, positive=True)
           for c in capacity_factors]  # fmt: skip
    with kit.one_thread():  # tiny matrices: one thread is several times faster here
        rows = [r for name in names for cf in cfs for r in _run(name, cf, k, n, b, loss, seed)]
    return kit.frame(rows, TrainRow)
