"""Context-parallel attention: one entry point over the three methods, the module that wraps
it, and the model-level helpers (parallelize_context, sync_context_grads)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal, cast

import torch
import torch.distributed as dist
from torch import nn

from course_lib import validate
from course_lib.parallel.context.gather import allgather_kv_attention, ulysses_attention
from course_lib.parallel.context.layout import (
    LAYOUTS,
    cp_group,
    positions,
)
from course_lib.parallel.context.ring import ring_attention
from course_lib.runtime.groups import Group

__all__ = [
    "Method",
    "METHODS",
    "context_attention",
    "ContextParallelAttention",
    "parallelize_context",
    "sync_context_grads",
]

#: how attention gets the keys it needs
Method = Literal["ring", "allgather", "ulysses"]
METHODS: tuple[Method, ...] = ("ring", "allgather", "ulysses")


def context_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    method: str = "ring",
    group: Group = None,
    causal: bool = True,
    layout: str = "zigzag",
    check_shapes: bool = True,
) -> torch.Tensor:
    """One of the three methods by name (Ulysses needs ``layout="contiguous"``)."""
    m = validate.choice("method", method, METHODS)
    lay = validate.choice("layout", layout, LAYOUTS)
    if m == "ulysses":
        if lay != "contiguous":
            raise ValueError(
                f"layout = {lay!r}: expected 'contiguous' for Ulysses (its all-to-all "
                "concatenates the ranks' shards in rank order)"
            )
        return ulysses_attention(q, k, v, group=group, causal=causal, check_shapes=check_shapes)
    fn = ring_attention if m == "ring" else allgather_kv_attention
    return fn(q, k, v, group=group, causal=causal, layout=lay, check_shapes=check_shapes)


class ContextParallelAttention(nn.Module):
    """The GPT's causal self-attention on this rank's tokens, with the keys of all ranks
    brought by ``method``. Reuses the original module's qkv and output Linears."""

    def __init__(self, attn: Any, group: Group, method: str, layout: str):
        super().__init__()
        self.c_attn: nn.Module = attn.c_attn  # (C -> 3C): q, k, v of this rank's tokens
        self.c_proj: nn.Module = attn.c_proj
        self.n_head = int(attn.n_head)
        self.n_embd = int(attn.c_attn.in_features)
        self.group, self.method, self.layout = group, method, layout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        C = self.n_embd
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[2] != C:
            got = tuple(x.shape) if isinstance(x, torch.Tensor) else validate.describe(x)
            raise ValueError(
                f"x.shape = {got}: expected (batch, local_seq, {C}), this rank's tokens of "
                f"width n_embd = {C}"
            )
        B, n, _ = x.shape  # n: this rank's tokens
        hs = C // self.n_head
        q, k, v = self.c_attn(x).split(C, dim=2)  # 3 x (B, n, C)
        q, k, v = (
            t.view(B, n, self.n_head, hs).transpose(1, 2) for t in (q, k, v)
        )  # (B, nh, n, hs)
        y = context_attention(
            q, k, v, method=self.method, group=self.group, layout=self.layout, check_shapes=False
        )
        out: torch.Tensor = self.c_proj(y.transpose(1, 2).reshape(B, n, C))  # (B, n, C)
        return out


def parallelize_context(
    model: nn.Module, group: Group = None, *, method: str = "ring", layout: str = "zigzag"
) -> nn.Module:
    """Make the course's GPT (``models.GPT``, dropout 0) context parallel over ``group``, in
    place: every block's attention becomes a :class:`ContextParallelAttention`, and the
    position table the model slices becomes this rank's global positions (so the model expects
    its shard of a ``block_size``-token sequence, cut by :func:`shard_sequence` in ``layout``).
    Weights stay replicated: call :func:`sync_context_grads` after backward."""
    m = validate.choice("method", method, METHODS)
    lay = validate.choice("layout", layout, LAYOUTS)
    config = getattr(model, "config", None)
    if config is None or not hasattr(model, "blocks") or not hasattr(model, "pos"):
        raise TypeError(f"model = {validate.describe(model)}: expected a course_lib.models.GPT")
    if getattr(config, "dropout", 0.0):
        raise ValueError(f"model.config.dropout = {config.dropout!r}: expected 0.0")
    if m == "ulysses" and lay != "contiguous":
        raise ValueError(f"layout = {lay!r}: expected 'contiguous' for Ulysses")
    info = cp_group(group)
    if m == "ulysses" and config.n_head % info.world_size:
        raise ValueError(
            f"model.config.n_head = {config.n_head}: expected a multiple of the ranks, "
            f"{info.world_size} (Ulysses)"
        )
    pos = positions(config.block_size, rank=info.rank, world_size=info.world_size, layout=lay)
    model.register_buffer("pos", pos, persistent=False)
    model.register_forward_pre_hook(_ShardCheck(len(pos), config.block_size, lay), with_kwargs=True)
    for block in cast(Iterable[nn.Module], model.blocks):
        attn = ContextParallelAttention(cast(Any, block).attn, group, m, lay)
        block.register_module("attn", attn)
    return model


class _ShardCheck:
    """A forward pre-hook: the model's tokens must be this rank's whole shard, ``n`` of the
    ``block_size`` sequence, refused before any collective otherwise (the position table
    holds this rank's ``n`` global positions, and attention's layout needs all of them)."""

    def __init__(self, n: int, block_size: int, layout: str):
        self.n, self.block_size, self.layout = n, block_size, layout

    def __call__(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        idx = args[0] if args else kwargs.get("idx")
        if isinstance(idx, torch.Tensor) and idx.dim() == 2 and idx.shape[1] == self.n:
            return
        got = tuple(idx.shape) if isinstance(idx, torch.Tensor) else validate.describe(idx)
        raise ValueError(
            f"idx.shape = {got}: expected (batch, {self.n}), this rank's shard of the "
            f"block_size = {self.block_size} token sequence (shard_sequence(idx, ..., dim=1, "
            f"layout={self.layout!r}))"
        )


def sync_context_grads(model: nn.Module, group: Group = None) -> None:
    """Average the gradients of the (replicated) weights over the context-parallel ranks:
    each rank's backward covered its own tokens' losses (each the mean over its tokens)."""
    info = cp_group(group)
    if info.world_size == 1:
        return
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, group=group)
            p.grad /= info.world_size
