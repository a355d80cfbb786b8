"""Tensor parallelism's communications, each an autograd Function (layers: ``tensor.py``).

Megatron-LM (Shoeybi et al. 2019, arXiv:1909.08053, Sec. 3, Fig. 3) brackets every
tensor-parallel region with two conjugate operators:

* ``f`` (:class:`CopyToTensorParallelRegion`): identity forward, all-reduce backward;
* ``g`` (:class:`ReduceFromTensorParallelRegion`): all-reduce forward, identity backward.

Sequence parallelism (Korthikanti et al. 2022, arXiv:2205.05198, Sec. 4.2.2, Fig. 5) splits the
activations *between* the regions along the sequence: ``g`` becomes a reduce-scatter
(:class:`ReduceScatterToSequenceRegion`, the paper's g-bar) and ``f`` an all-gather
(:class:`AllGatherLinear`, the paper's g, fused with the column layer's matmul so that only the local chunk is
saved for backward). Bytes on the wire do not change (reduce-scatter + all-gather = all-reduce);
activation memory outside the regions is divided by ``t``.

Each Function's forward and backward are each other's adjoint: what one gathers the other keeps
a slice of, what one sums the other copies. :func:`gather_full` reassembles a split model's
tensors (parity checks).
"""

from __future__ import annotations

from typing import Any, Literal, cast

import torch
import torch.distributed as dist
import torch.nn.functional as F

from course_lib import validate
from course_lib.runtime.compat import all_gather_single, reduce_scatter_single
from course_lib.runtime.groups import Group, GroupInfo, group_info

__all__ = [
    "f",
    "g",
    "CopyToTensorParallelRegion",
    "ReduceFromTensorParallelRegion",
    "GatherFromTensorParallelRegion",
    "ScatterToTensorParallelRegion",
    "ScatterToSequenceRegion",
    "GatherFromSequenceRegion",
    "ReduceScatterToSequenceRegion",
    "AllGatherLinear",
    "tp_group",
    "apply",
    "gather_full",
    "sync_sequence_parallel_grads",
]


def tp_group(group: Group) -> GroupInfo:
    """This rank's place in the tensor-parallel ``group`` (tp = its world_size); one rank
    alone outside a process group."""
    return group_info(group, needs="a tensor-parallel group", single=True)


# ---- the three tensor moves the Functions are made of ---------------------------------------
def _all_gather(x: torch.Tensor, dim: int, group: Group) -> torch.Tensor:
    """Every rank's ``x`` concatenated along ``dim``, in rank order."""
    t = tp_group(group).world_size
    front = x.movedim(dim, 0).contiguous()  # (n, ...): all_gather_single stacks along dim 0
    out = front.new_empty((t * front.shape[0], *front.shape[1:]))
    all_gather_single(out, front, group=group)
    return out.movedim(0, dim).contiguous()


def _reduce_scatter(x: torch.Tensor, dim: int, group: Group) -> torch.Tensor:
    """The sum over ranks of ``x``, this rank's chunk along ``dim``."""
    t = tp_group(group).world_size
    front = x.movedim(dim, 0).contiguous()  # (t n, ...)
    out = front.new_empty((front.shape[0] // t, *front.shape[1:]))
    reduce_scatter_single(out, front, group=group)
    return out.movedim(0, dim).contiguous()


def _chunk(x: torch.Tensor, dim: int, group: Group) -> torch.Tensor:
    """This rank's chunk of ``x`` along ``dim``."""
    r, t, _, _ = tp_group(group)
    return x.chunk(t, dim=dim)[r].contiguous()


def _all_reduce(x: torch.Tensor, group: Group) -> torch.Tensor:
    """The sum over ranks of ``x``, in a new tensor."""
    out = x.contiguous().clone()
    dist.all_reduce(out, group=group)
    return out


# ---- Megatron's f and g (Shoeybi et al. 2019, Fig. 3) ---------------------------------------
class CopyToTensorParallelRegion(torch.autograd.Function):
    """``f``. Forward: identity (every rank already holds the whole input). Backward:
    all-reduce, since each rank's ``dL/dx`` covers only its own columns."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Group) -> torch.Tensor:
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _all_reduce(grad, ctx.group), None


class ReduceFromTensorParallelRegion(torch.autograd.Function):
    """``g``. Forward: all-reduce the ranks' partial sums (a row layer's output). Backward:
    identity, since every rank needs the whole ``dL/dY`` and has it."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Group) -> torch.Tensor:
        return _all_reduce(x, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


f = CopyToTensorParallelRegion  #: the paper's name: ``f.apply(x, group)``
g = ReduceFromTensorParallelRegion  #: the paper's name: ``g.apply(x, group)``


class GatherFromTensorParallelRegion(torch.autograd.Function):
    """Forward: all-gather along the last dim. Backward: keep this rank's slice
    (``ColumnParallelLinear(gather_output=True)``)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Group) -> torch.Tensor:
        ctx.group = group
        return _all_gather(x, -1, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _chunk(grad, -1, ctx.group), None


class ScatterToTensorParallelRegion(torch.autograd.Function):
    """Forward: keep this rank's slice of the last dim. Backward: all-gather
    (``RowParallelLinear(input_is_parallel=False)``)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Group) -> torch.Tensor:
        ctx.group = group
        return _chunk(x, -1, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _all_gather(grad, -1, ctx.group), None


# ---- sequence parallelism (Korthikanti et al. 2022, Sec. 4.2.2) ------------------------------
class ScatterToSequenceRegion(torch.autograd.Function):
    """Forward: keep this rank's chunk of the sequence (dim 1), after the replicated
    embeddings. Backward: all-gather the chunks' gradients."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Group) -> torch.Tensor:
        ctx.group = group
        return _chunk(x, 1, group)  # (B, T/t, C)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _all_gather(grad, 1, ctx.group), None


class GatherFromSequenceRegion(torch.autograd.Function):
    """Forward: all-gather the sequence chunks. Backward: keep this rank's chunk, since what
    follows is replicated (every rank computes the same loss: the tiny GPT's ln_f and head)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Group) -> torch.Tensor:
        ctx.group = group
        return _all_gather(x, 1, group)  # (B, T, C)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _chunk(grad, 1, ctx.group), None


class ReduceScatterToSequenceRegion(torch.autograd.Function):
    """The paper's g-bar (Fig. 5). Forward: reduce-scatter along the sequence (the row layer's
    partial sums, each rank keeping its chunk). Backward: all-gather."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Group) -> torch.Tensor:
        ctx.group = group
        return _reduce_scatter(x, 1, group)  # (B, T, C) partial -> (B, T/t, C) summed

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _all_gather(grad, 1, ctx.group), None


class AllGatherLinear(torch.autograd.Function):
    """The paper's g (Fig. 5) fused with the column layer. Forward: all-gather the sequence chunks,
    then the matmul; saves only this rank's chunk (1/t of the input). Backward: gathers the
    input again, and the input's gradient leaves by reduce-scatter."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, group: Group
    ) -> torch.Tensor:  # x: (B, T/t, in); weight: (out/t, in)
        ctx.group, ctx.has_bias = group, bias is not None
        ctx.save_for_backward(x, weight)
        return F.linear(_all_gather(x, 1, group), weight, bias)  # (B, T, out/t)

    @staticmethod
    def backward(
        ctx: Any, grad: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, None]:  # grad: (B, T, out/t)
        x, weight = ctx.saved_tensors
        full = _all_gather(x, 1, ctx.group)  # (B, T, in): gathered again, not stored
        grad_input = _reduce_scatter(grad @ weight, 1, ctx.group)  # (B, T/t, in)
        grad_weight = grad.flatten(0, 1).t() @ full.flatten(0, 1)  # (out/t, in)
        grad_bias = grad.flatten(0, 1).sum(0) if ctx.has_bias else None
        return grad_input, grad_weight, grad_bias, None


# ---- typed entry points for the layers -----------------------------------------------------
def apply(fn: type[torch.autograd.Function], *args: object) -> torch.Tensor:
    """``fn.apply(*args)``, typed (torch's stubs leave ``Function.apply`` untyped)."""
    return cast(torch.Tensor, fn.apply(*args))


def gather_full(
    model: torch.nn.Module, which: Literal["param", "grad"] = "param", group: Group = None
) -> dict[str, torch.Tensor]:
    """``{name: full tensor}`` of a split model's parameters (``which="param"``) or gradients
    (``"grad"``), in the names and shapes of the unsplit model (a collective: call it on every
    rank). The harness's ``gather_fn`` for tensor parallelism."""
    which = validate.choice("which", which, ("param", "grad"))
    t = tp_group(group).world_size
    out = {}
    for name, p in model.named_parameters():
        x = p if which == "param" else p.grad
        if x is None:
            continue
        split: tuple[int, int] | None = getattr(p, "tp_split", None)
        if split is not None and t > 1:
            x = _unsplit(x.detach(), split, t, group)
        out[name] = x.detach().to("cpu", copy=True)
    return out


def _unsplit(x: torch.Tensor, split: tuple[int, int], t: int, group: Group) -> torch.Tensor:
    """The full tensor of which every rank holds ``x``: ``split = (dim, chunks)``, each of the
    ``chunks`` blocks along ``dim`` cut over the ranks (3 blocks for a fused q, k, v)."""
    dim, chunks = split
    parts = [torch.empty_like(x) for _ in range(t)]
    dist.all_gather(parts, x.contiguous(), group=group)
    blocks = [part.chunk(chunks, dim=dim) for part in parts]  # rank x chunk
    return torch.cat([torch.cat([b[c] for b in blocks], dim=dim) for c in range(chunks)], dim=dim)


def sync_sequence_parallel_grads(model: torch.nn.Module, group: Group = None) -> int:
    """Sum over the ranks the gradients of parameters used on sequence chunks (LayerNorms in
    the blocks, the row layers' biases), in one flattened all-reduce. Returns the calls made."""
    grads: list[torch.Tensor] = [
        p.grad
        for p in model.parameters()
        if getattr(p, "sequence_parallel_partial", False) and p.grad is not None
    ]
    if not grads or tp_group(group).world_size == 1:
        return 0
    flat = torch.cat([gr.reshape(-1) for gr in grads])
    dist.all_reduce(flat, group=group)
    for gr, part in zip(grads, torch.split(flat, [gr.numel() for gr in grads])):
        gr.copy_(part.view_as(gr))
    return 1
