"""Unit 15: what attention keeps for backward, per rank, against the sequence length
(notebooks/15_context_parallelism.ipynb). Re-exported by ``run.py``.

Measured with ``torch.autograd.graph.saved_tensors_hooks``: every tensor autograd saves during
the forward passes through the hook, and the bytes of the distinct storages are summed."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch

from course_lib import kit, validate
from course_lib.measure import estimate
from course_lib.parallel import context as C
from course_lib.runtime.launch import launch

__all__ = ["SavedRow", "saved_bytes"]


@dataclass(frozen=True)
class SavedRow:
    """:func:`saved_bytes`: what one kind of attention keeps for backward at one length."""

    seq: int
    kind: str
    measured: int
    predicted: int
    residual: int


def _saved(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> int:
    """Bytes of the distinct storages autograd saves while ``fn(*args, **kwargs)`` runs."""
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        seen[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(*args, **kwargs)
    return sum(seen.values())


def _inputs(seq: int, heads: int, head_dim: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seq)
    return [torch.randn(1, heads, seq, head_dim, generator=g).requires_grad_() for _ in range(3)]


def _ring_worker(
    rank: int, world_size: int, seqs: list[int], heads: int, head_dim: int
) -> list[int]:
    out = []
    for s in seqs:
        cut: dict[str, Any] = dict(rank=rank, world_size=world_size, dim=2, layout="zigzag")
        q, k, v = (
            C.shard_sequence(t.detach(), **cut).requires_grad_()
            for t in _inputs(s, heads, head_dim)
        )
        out.append(_saved(C.ring_attention, q, k, v, check_shapes=False))
    return out


def saved_bytes(
    seqs: Sequence[int] = (64, 128, 256, 512),
    *,
    world_size: int = 2,
    heads: int = 4,
    head_dim: int = 16,
) -> pd.DataFrame:
    """Bytes autograd keeps for backward, causal attention, batch 1, float32: attention written
    out in one process (``attention_block`` under autograd: the s x s scores and probabilities)
    and ring attention on ``world_size`` ranks (rank 0; every rank keeps the same), each beside
    ``estimate.attention_saved_bytes``. One row per seq and kind: measured, predicted, residual."""
    ss = validate.counts("seqs", seqs, minimum=1)
    w = validate.count("world_size", world_size, minimum=1, maximum=8)
    for s in ss:
        C.segments(s, rank=0, world_size=w, layout="zigzag")  # refuses a bad seq here
    ring = launch(_ring_worker, w, ss, heads, head_dim)[0]
    rows = []
    for s, ring_bytes in zip(ss, ring):
        q, k, v = _inputs(s, heads, head_dim)
        mask = torch.ones(s, s, dtype=torch.bool).triu(1)
        one = _saved(C.attention_block, q, k, v, mask)
        for kind, measured, kw in (
            ("one process, written out", one, dict(blockwise=False)),
            (f"ring, one rank of {w}", ring_bytes, dict(cp=w)),
        ):
            pred = estimate.attention_saved_bytes(s, 1, heads * head_dim, heads, **kw)
            rows.append(SavedRow(s, kind, measured, pred, measured - pred))
    return kit.frame(rows, SavedRow)
