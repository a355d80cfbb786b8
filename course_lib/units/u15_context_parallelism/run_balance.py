"""Unit 15, §5: does counting blocks predict a rank's compute time? (``unit.run.block_times``)

A causal ring computes two kinds of blocks: *full* ones (every key before every query: no mask)
and *diagonal* ones (the mask hides part of the block; ``masked_fill`` and an exp over -inf
entries make them dearer on a CPU). :func:`block_kinds` counts each kind per rank from the
layout alone; :func:`block_times` times one full and one diagonal block (forward + backward, one
process, one thread, median of several) at the block size a layout uses, and predicts each
rank's compute time as ``full x t_full + diagonal x t_diag``, to put beside the ring's measured
compute (``run.balance``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import pandas as pd
import torch

from course_lib import kit, validate
from course_lib.parallel import context as C
from course_lib.parallel.context.blocks import (
    attention_block,
    attention_block_backward,
    block_mask,
    visibility,
)

__all__ = ["BlockTimeRow", "block_kinds", "block_times"]


@dataclass(frozen=True)
class BlockTimeRow:
    """:func:`block_times`: one rank's blocks, the measured block costs, the time they predict."""

    layout: str
    rank: int
    full: int
    diagonal: int
    block_tokens: int
    t_full_ms: float
    t_diag_ms: float
    predicted_ms: float
    predicted_vs_busiest: float


def block_kinds(world_size: int, seq: int, layout: str) -> list[dict[str, int]]:
    """Per rank of a causal ring: the full and the diagonal (partly masked) blocks it computes
    over all ring steps, counted from the layout's token ranges."""
    w = validate.count("world_size", world_size, minimum=1, maximum=64)
    rows = []
    for r in range(w):
        mine = C.segments(seq, rank=r, world_size=w, layout=layout)
        kinds = {"all": 0, "partial": 0, "none": 0}
        for src in range(w):
            for qr in mine:
                for kr in C.segments(seq, rank=src, world_size=w, layout=layout):
                    kinds[visibility(qr, kr, True)] += 1
        rows.append({"rank": r, "full": kinds["all"], "diagonal": kinds["partial"]})
    return rows


def _block_seconds(n: int, heads: int, head_dim: int, masked: bool, repeats: int) -> float:
    """Median seconds of one block's forward + backward (n queries over n keys)."""
    g = torch.Generator().manual_seed(0)
    q, k, v, dout = (torch.randn(1, heads, n, head_dim, generator=g) for _ in range(4))
    mask = block_mask((0, n), (0, n)) if masked else None
    times = []
    for _ in range(repeats + 1):  # the first is a warm-up
        t0 = time.perf_counter()
        out, lse = attention_block(q, k, v, mask)
        attention_block_backward(q, k, v, dout, lse, (dout * out).sum(-1), mask)
        times.append(time.perf_counter() - t0)
    return sorted(times[1:])[len(times[1:]) // 2]


def block_times(
    world_size: int = 2, *, shape: tuple[int, int, int, int, int] = (1, 4, 4, 1024, 16),
    repeats: int = 7,
) -> pd.DataFrame:  # fmt: skip
    """Per layout and rank: full and diagonal blocks (:func:`block_kinds`), the MEASURED
    seconds of one full and one diagonal block of the layout's size (one process, one thread),
    the time they predict for the rank (``full x t_full + diagonal x t_diag``), and that time
    relative to the layout's busiest rank (``predicted_vs_busiest``)."""
    _, h, _, s, d = shape
    reps = validate.count("repeats", repeats, minimum=1)
    rows = []
    with kit.one_thread():  # as each rank of the ring runs
        for lay in C.LAYOUTS:
            n = s // (world_size * C.chunks_per_rank(lay))
            full, diag = (1e3 * _block_seconds(n, h, d, m, reps) for m in (False, True))
            kinds = block_kinds(world_size, s, lay)
            pred = [k["full"] * full + k["diagonal"] * diag for k in kinds]
            rows += [BlockTimeRow(lay, k["rank"], k["full"], k["diagonal"], n, full, diag, p,
                                  p / max(pred)) for k, p in zip(kinds, pred)]  # fmt: skip
    return kit.frame(rows, BlockTimeRow)
