"""Tensor-parallel layers: column- and row-parallel Linear, the parallel self-attention,
and parallelize_gpt (a GPT's blocks split over the tp group)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from course_lib import validate
from course_lib.parallel.tensor.checks import check_split, check_tp
from course_lib.parallel.tensor.comms import (
    AllGatherLinear,
    GatherFromSequenceRegion,
    GatherFromTensorParallelRegion,
    ReduceScatterToSequenceRegion,
    ScatterToSequenceRegion,
    ScatterToTensorParallelRegion,
    apply,
    f,
    g,
    tp_group,
)
from course_lib.runtime.groups import Group

if TYPE_CHECKING:
    from course_lib.models import GPT

__all__ = ["ColumnParallelLinear", "RowParallelLinear", "ParallelSelfAttention", "parallelize_gpt"]


def _mark(params: Any, **attrs: object) -> None:
    """Tag parameters for later passes: ``tp_split`` (how :func:`gather_full` reassembles
    them), ``sequence_parallel_partial`` (summed by :func:`sync_sequence_parallel_grads`)."""
    for p in params:
        for name, value in attrs.items():
            setattr(p, name, value)


def _like(linear: nn.Linear, group: Group) -> dict[str, Any]:
    """The keywords that make a parallel layer of ``linear``'s kind (its values still to copy)."""
    w = linear.weight
    return dict(bias=linear.bias is not None, group=group, dtype=w.dtype, device=w.device)


class _ParallelLinear(nn.Module):
    """What the column and row layers share: sizes, group, this rank's ``weight`` and ``bias``
    (an ``nn.Linear``'s, of the split sizes, so the initialisation is nn.Linear's)."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        split: Literal["in_features", "out_features"],
        bias: bool,
        group: Group,
        dtype: torch.dtype | None,
        device: torch.device | str | None,
    ) -> None:
        super().__init__()
        self.tp = t = tp_group(group).world_size
        self.in_features = validate.count("in_features", in_features, minimum=1)
        self.out_features = validate.count("out_features", out_features, minimum=1)
        check_split(split, in_features if split == "in_features" else out_features, t)
        self.group = group
        rows, cols = (
            (in_features // t, out_features)
            if split == "in_features"
            else (in_features, out_features // t)
        )
        ref = nn.Linear(rows, cols, bias=bias, dtype=dtype, device=device)
        self.weight, self.bias = ref.weight, ref.bias

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, tp={self.tp}"
            f" (weight {tuple(self.weight.shape)} per rank)"
        )


class ColumnParallelLinear(_ParallelLinear):
    """``Y = X A^T + b`` with ``A``'s rows (output features) split over the ranks of ``group``.

    weight ``(out_features/t, in_features)``, bias ``(out_features/t,)``. Forward: ``f`` then
    the local matmul; the output is this rank's ``out/t`` features, or all of them when
    ``gather_output`` (an all-gather). With ``sequence_parallel`` the input is this rank's
    sequence chunk and :class:`AllGatherLinear` replaces ``f``."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        bias: bool = True,
        gather_output: bool = False,
        group: Group = None,
        sequence_parallel: bool = False,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__(in_features, out_features, "out_features", bias, group, dtype, device)
        self.gather_output, self.sequence_parallel = bool(gather_output), bool(sequence_parallel)
        _mark(self.parameters(), tp_split=(0, 1))  # (dim, chunks)

    @classmethod
    def from_linear(
        cls, linear: nn.Linear, group: Group = None, *, chunks: int = 1, **kwargs: Any
    ) -> ColumnParallelLinear:
        """This rank's part of an existing ``linear``. ``chunks``: the output holds that many
        blocks side by side (3 for a fused q, k, v), each split over the ranks."""
        layer = cls(linear.in_features, linear.out_features, **_like(linear, group), **kwargs)
        r = tp_group(group).rank
        with torch.no_grad():
            for mine, full in ((layer.weight, linear.weight), (layer.bias, linear.bias)):
                if mine is not None and full is not None:
                    blocks = full.chunk(chunks, dim=0)  # chunks x (out/chunks, ...)
                    mine.copy_(torch.cat([b.chunk(layer.tp, dim=0)[r] for b in blocks]))
        _mark(layer.parameters(), tp_split=(0, chunks))
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp == 1:
            y = F.linear(x, self.weight, self.bias)
        elif self.sequence_parallel:
            y = apply(AllGatherLinear, x, self.weight, self.bias, self.group)  # (B, T, out/t)
        else:
            y = F.linear(apply(f, x, self.group), self.weight, self.bias)  # (..., out/t)
        if self.gather_output and self.tp > 1:
            y = apply(GatherFromTensorParallelRegion, y, self.group)  # (..., out)
        return y


class RowParallelLinear(_ParallelLinear):
    """``Y = X A^T + b`` with ``A``'s columns (input features) split over the ranks of
    ``group``. weight ``(out_features, in_features/t)``; bias ``(out_features,)``, the same on
    every rank and added once, after the sum. Forward: the local matmul, then ``g`` (or a
    reduce-scatter along the sequence with ``sequence_parallel``). ``input_is_parallel=False``:
    the input is whole and each rank first keeps its slice."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        bias: bool = True,
        input_is_parallel: bool = True,
        group: Group = None,
        sequence_parallel: bool = False,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__(in_features, out_features, "in_features", bias, group, dtype, device)
        self.input_is_parallel = bool(input_is_parallel)
        self.sequence_parallel = bool(sequence_parallel)
        if self.bias is not None:  # nn.Linear's bound 1/sqrt(fan_in) with the full fan_in
            with torch.no_grad():
                self.bias.uniform_(-(in_features**-0.5), in_features**-0.5)
            _mark([self.bias], sequence_parallel_partial=self.sequence_parallel)
        _mark([self.weight], tp_split=(1, 1))

    @classmethod
    def from_linear(
        cls, linear: nn.Linear, group: Group = None, **kwargs: Any
    ) -> RowParallelLinear:
        """This rank's part of an existing ``linear``."""
        layer = cls(linear.in_features, linear.out_features, **_like(linear, group), **kwargs)
        r = tp_group(group).rank
        with torch.no_grad():
            layer.weight.copy_(linear.weight.chunk(layer.tp, dim=1)[r])
            if layer.bias is not None and linear.bias is not None:
                layer.bias.copy_(linear.bias)
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp == 1:
            return F.linear(x, self.weight, self.bias)
        if not self.input_is_parallel:
            x = apply(ScatterToTensorParallelRegion, x, self.group)  # (..., in/t)
        y = F.linear(x, self.weight)  # (..., out): this rank's partial sum
        if self.sequence_parallel:
            y = apply(ReduceScatterToSequenceRegion, y, self.group)  # (B, T/t, out)
        else:
            y = apply(g, y, self.group)  # (..., out): the sum over ranks
        return y + self.bias if self.bias is not None else y


# ---- the tiny GPT, split ---------------------------------------------------------------------
class ParallelSelfAttention(nn.Module):
    """``models.CausalSelfAttention`` over this rank's ``n_head/t`` heads: qkv column-parallel
    (the fused q, k, v split head-wise, 3 chunks), output projection row-parallel. Heads are
    independent, so nothing is communicated in between. Also used with ``nn.Linear`` layers
    whose qkv rows are ordered rank by rank (DTensor's ColwiseParallel, see unit 11's run)."""

    def __init__(
        self, c_attn: nn.Module, c_proj: nn.Module, head_size: int, causal_mask: torch.Tensor
    ) -> None:
        super().__init__()
        self.c_attn, self.c_proj, self.head_size = c_attn, c_proj, head_size
        self.register_buffer("causal_mask", causal_mask, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, T, C), or (B, T/t, C) with SP
        hs = self.head_size
        q, k, v = self.c_attn(x).chunk(3, dim=-1)  # 3 x (B, T, C/t) views
        B, T, _ = q.shape
        q = q.view(B, T, -1, hs).transpose(1, 2)  # (B, nh/t, T, hs)
        k = k.view(B, T, -1, hs).transpose(1, 2)  # (B, nh/t, T, hs)
        v = v.view(B, T, -1, hs).transpose(1, 2)  # (B, nh/t, T, hs)
        att = (q @ k.transpose(-2, -1)) * (1.0 / hs**0.5)  # (B, nh/t, T, T)
        mask = self.get_buffer("causal_mask")[:T, :T]
        att = att.masked_fill(mask, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = att @ v  # (B, nh/t, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, -1)  # (B, T, C/t)
        out: torch.Tensor = self.c_proj(y)  # (B, T, C) after g, or (B, T/t, C) after the RS
        return out


def parallelize_gpt(model: GPT, group: Group = None, *, sequence_parallel: bool = False) -> GPT:
    """Split the tiny GPT (``models.GPT``) in place over the ranks of ``group`` (all ranks by
    default; outside a process group it is the identity split, tp = 1) and return it.

    Per block: attention qkv ``ColumnParallelLinear`` (heads split), output projection
    ``RowParallelLinear``; MLP c_fc column-parallel, c_proj row-parallel. Embeddings, LayerNorms
    and the (tied) head stay replicated. ``sequence_parallel``: the residual stream between the
    blocks' parallel regions is split along the sequence (call
    :func:`sync_sequence_parallel_grads` after backward). Every rank must pass the same model."""
    t = tp_group(group).world_size
    check_tp(model.config, t, sequence_parallel=sequence_parallel)
    sp = bool(sequence_parallel) and t > 1
    hs = model.config.n_embd // model.config.n_head
    blocks: list[Any] = list(model.blocks)  # models.Block, whose layers get replaced
    for block in blocks:
        att = block.attn
        block.attn = ParallelSelfAttention(
            ColumnParallelLinear.from_linear(att.c_attn, group, chunks=3, sequence_parallel=sp),
            RowParallelLinear.from_linear(att.c_proj, group, sequence_parallel=sp),
            hs,
            att.causal_mask,
        )
        block.mlp.c_fc = ColumnParallelLinear.from_linear(
            block.mlp.c_fc, group, sequence_parallel=sp
        )
        block.mlp.c_proj = RowParallelLinear.from_linear(
            block.mlp.c_proj, group, sequence_parallel=sp
        )
        if sp:
            _mark(
                [*block.ln_1.parameters(), *block.ln_2.parameters()], sequence_parallel_partial=True
            )
    if sp:  # split the stream after the embeddings, gather it before the replicated head
        model.blocks[0].register_forward_pre_hook(
            lambda m, args: (apply(ScatterToSequenceRegion, args[0], group),)
        )
        model.ln_f.register_forward_pre_hook(
            lambda m, args: (apply(GatherFromSequenceRegion, args[0], group),)
        )
    _mark([model], tp_group=group, tp=t, sequence_parallel=sp)
    return model
