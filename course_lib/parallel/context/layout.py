"""Context parallelism's sequence layouts and input checks (attention: ``context.py``).

A sequence of ``s`` tokens is split over ``W`` ranks in one of two layouts:

* ``"contiguous"``: rank r holds tokens [r s/W, (r+1) s/W). Under a causal mask the last rank's
  queries see every key and the first rank's see only their own block: W to 1 in work.
* ``"zigzag"``: the sequence is cut into 2W chunks and rank r holds chunks r and 2W-1-r (one
  early, one late), so every rank does the same causal work (Brandon et al. 2023,
  arXiv:2311.09431, stripe the tokens finer for the same reason).

Every function here is local: no communication except :func:`check_same_shapes`, which
all-gathers eight integers so that mismatched ranks fail with one message before any attention
traffic. Introduced in notebooks/15_context_parallelism.ipynb.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import torch

from course_lib import validate
from course_lib.runtime.compat import all_gather_single
from course_lib.runtime.groups import Group, GroupInfo, group_info

__all__ = [
    "Layout",
    "LAYOUTS",
    "cp_group",
    "chunks_per_rank",
    "segments",
    "positions",
    "shard_sequence",
    "unshard_sequence",
    "check_qkv",
    "check_same_shapes",
]

#: how a rank's tokens sit in the full sequence
Layout = Literal["contiguous", "zigzag"]
LAYOUTS: tuple[Layout, ...] = ("contiguous", "zigzag")


def cp_group(group: Group) -> GroupInfo:
    """This rank's place in the context-parallel ``group``; one rank alone outside a group."""
    return group_info(group, needs="context parallelism", single=True)


def chunks_per_rank(layout: str) -> int:
    """How many equal chunks of the sequence one rank holds: 1 (contiguous) or 2 (zigzag)."""
    return 1 if validate.choice("layout", layout, LAYOUTS) == "contiguous" else 2


def segments(seq: int, *, rank: int, world_size: int, layout: str) -> list[tuple[int, int]]:
    """The (start, end) token ranges of the full sequence that ``rank`` holds, in the order its
    shard stores them. ``seq`` must divide into ``world_size`` x chunks_per_rank chunks."""
    w = validate.count("world_size", world_size, minimum=1)
    r = validate.count("rank", rank, minimum=0, maximum=w - 1)
    k = chunks_per_rank(layout)
    s = validate.count("seq", seq, minimum=1)
    if s % (k * w):
        raise ValueError(
            f"seq = {s}: expected a multiple of {k * w} (the {layout} layout cuts the sequence "
            f"into {k} x world_size = {k * w} equal chunks)"
        )
    c = s // (k * w)
    owned = [r] if k == 1 else [r, 2 * w - 1 - r]
    return [(i * c, (i + 1) * c) for i in owned]


def positions(seq: int, *, rank: int, world_size: int, layout: str) -> torch.Tensor:
    """Global positions (int64) of the tokens ``rank`` holds, in its shard's order."""
    parts = segments(seq, rank=rank, world_size=world_size, layout=layout)
    return torch.cat([torch.arange(a, b) for a, b in parts])


def shard_sequence(
    x: torch.Tensor, *, rank: int, world_size: int, dim: int, layout: str = "zigzag"
) -> torch.Tensor:
    """This rank's shard of ``x`` along ``dim`` (a contiguous copy)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x = {validate.describe(x)}: expected a torch.Tensor")
    d = validate.count("dim", dim, minimum=-x.dim(), maximum=x.dim() - 1) % x.dim()
    parts = segments(x.shape[d], rank=rank, world_size=world_size, layout=layout)
    return torch.cat([x.narrow(d, a, b - a) for a, b in parts], dim=d).contiguous()


def unshard_sequence(
    shards: Sequence[torch.Tensor], *, dim: int, layout: str = "zigzag"
) -> torch.Tensor:
    """The full tensor from every rank's shard (``shards[r]`` from rank r): the inverse of
    :func:`shard_sequence`."""
    w = len(shards)
    if w == 0:
        raise ValueError("shards = []: expected one tensor per rank")
    k = chunks_per_rank(layout)
    d = dim % shards[0].dim()
    n = shards[0].shape[d]
    if n % k:
        raise ValueError(f"shards[0].shape[{d}] = {n}: expected a multiple of {k} ({layout})")
    seq = n * w
    pieces: list[torch.Tensor | None] = [None] * (k * w)
    c = seq // (k * w)
    for r, shard in enumerate(shards):
        for j, (a, _) in enumerate(segments(seq, rank=r, world_size=w, layout=layout)):
            pieces[a // c] = shard.narrow(d, j * c, c)
    return torch.cat([p for p in pieces if p is not None], dim=d)


def check_qkv(
    q: Any,
    k: Any,
    v: Any,
    *,
    world_size: int,
    layout: str | None,
    heads_split: bool = False,
) -> None:
    """Refuse bad attention inputs before any communication: 4-D tensors
    [batch, heads, local_seq, head_dim] of one floating dtype, k and v alike, at least one head,
    token and head dimension (an empty batch is fine: empty output), heads a multiple of k's
    heads (grouped-query attention), the local sequence a multiple of the layout's chunks per
    rank; with ``heads_split`` (Ulysses) both head counts divisible by the ranks."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise TypeError(
                f"{name} = {validate.describe(t)}: expected a 4-D tensor "
                "[batch, heads, local_seq, head_dim]"
            )
        if not t.dtype.is_floating_point or t.dtype != q.dtype:
            raise TypeError(f"{name}.dtype = {t.dtype}: expected q's floating dtype, {q.dtype}")
    for name, t in (("q", q), ("k", k)):
        for dim, what in ((1, "heads"), (2, "local_seq (this rank's tokens)"), (3, "head_dim")):
            if t.shape[dim] == 0:
                raise ValueError(
                    f"{name}.shape[{dim}] = 0: expected {what} >= 1 in "
                    f"[batch, heads, local_seq, head_dim] ({name}.shape = {tuple(t.shape)})"
                )
    b, h, n, d = q.shape
    if tuple(k.shape) != tuple(v.shape) or (k.shape[0], k.shape[2], k.shape[3]) != (b, n, d):
        raise ValueError(
            f"k.shape, v.shape = {tuple(k.shape)}, {tuple(v.shape)}: expected "
            f"[{b}, kv_heads, {n}, {d}] for both (q is {tuple(q.shape)})"
        )
    if h % k.shape[1]:
        raise ValueError(f"k.shape[1] = {k.shape[1]}: expected a divisor of q's heads, {h}")
    if layout is not None and n % chunks_per_rank(layout):
        raise ValueError(
            f"q.shape[2] = {n}: expected an even local sequence for the zigzag layout "
            "(two chunks per rank)"
        )
    if heads_split:
        for name, heads in (("q.shape[1]", h), ("k.shape[1]", k.shape[1])):
            if heads % world_size:
                raise ValueError(
                    f"{name} = {heads}: expected a multiple of the ranks, {world_size} "
                    "(Ulysses gives every rank whole heads)"
                )


def check_same_shapes(info: GroupInfo, *tensors: torch.Tensor) -> None:
    """Every rank passes tensors of the same shapes: one all-gather of eight integers, then the
    same error on every rank if they differ (so no rank waits for a partner that left)."""
    if info.world_size == 1:
        return
    mine = torch.tensor([x for t in tensors for x in t.shape], dtype=torch.int64)
    allr = mine.new_empty(info.world_size * mine.numel())
    all_gather_single(allr, mine, group=info.group)
    table = allr.view(info.world_size, -1)
    for r in range(info.world_size):
        if not torch.equal(table[r], table[0]):
            got, want = tuple(table[r].tolist()), tuple(table[0].tolist())
            raise ValueError(
                f"q, k, v shapes on rank {r} = {got}: expected the same on every rank "
                f"(rank 0 has {want})"
            )
