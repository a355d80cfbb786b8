"""Unit 15: the course's tiny GPT trained with its sequence split over ranks, against one
process (notebooks/15_context_parallelism.ipynb). Re-exported by ``run.py``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pandas as pd
import torch
import torch.distributed as dist

from course_lib import kit, validate
from course_lib.models import GPT, GPTConfig
from course_lib.parallel import context as C
from course_lib.runtime.launch import launch

__all__ = ["CONFIG", "TrainRow", "train_parity"]

#: 2 layers, 4 heads, width 64, 32 tokens: splits over 1, 2, 4 ranks in both layouts
CONFIG = GPTConfig.tiny(n_layer=2, block_size=32)
BATCH, LR = 2, 0.1


@dataclass(frozen=True)
class TrainRow:
    """:func:`train_parity`: one step's loss, context parallel and in one process."""

    method: str
    layout: str
    step: int
    one_process: float
    context_parallel: float
    abs_diff: float


def _model() -> GPT:
    torch.manual_seed(0)
    return GPT(CONFIG)


def _batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randint(0, CONFIG.vocab_size, (BATCH, CONFIG.block_size), generator=g)
    return x, torch.roll(x, -1, dims=1)


def _losses(
    model: GPT, steps: int, cut: Callable[[torch.Tensor], torch.Tensor] | None = None
) -> list[float]:
    """SGD steps; the loss of each step (over the whole sequence: the ranks' mean)."""
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    out = []
    for step in range(steps):
        x, y = (t if cut is None else cut(t) for t in _batch(step))
        loss = model.loss(x, y)
        opt.zero_grad()
        loss.backward()
        if cut is not None:
            C.sync_context_grads(model)
            loss = loss.detach().clone()
            dist.all_reduce(loss)  # every rank's mean over its tokens, equal counts
            loss /= dist.get_world_size()
        opt.step()
        out.append(float(loss.detach()))
    return out


def _train_worker(rank: int, world_size: int, method: str, layout: str, steps: int) -> list[float]:
    model = _model()
    C.parallelize_context(model, method=method, layout=layout)  # in place

    def cut(t: torch.Tensor) -> torch.Tensor:
        return C.shard_sequence(t, rank=rank, world_size=world_size, dim=1, layout=layout)

    return _losses(model, steps, cut)


def train_parity(
    world_size: int = 2,
    *,
    methods: Sequence[str] = ("ring", "allgather", "ulysses"),
    steps: int = 4,
) -> pd.DataFrame:
    """``steps`` SGD steps (lr 0.1, batch 2 x 32 tokens) of the tiny GPT made context parallel
    over ``world_size`` ranks by each method (zigzag, Ulysses contiguous), beside one process.
    One row per method and step: the two losses and their difference."""
    w = validate.count("world_size", world_size, minimum=1, maximum=4)
    n = validate.count("steps", steps, minimum=1)
    ms = validate.choices("methods", methods, C.METHODS)
    reference = _losses(_model(), n)
    rows = []
    for m in ms:
        lay = "contiguous" if m == "ulysses" else "zigzag"
        got = launch(_train_worker, w, m, lay, n)[0]
        rows += [
            TrainRow(m, lay, i, a, b, abs(a - b)) for i, (a, b) in enumerate(zip(reference, got))
        ]
    return kit.frame(rows, TrainRow)
