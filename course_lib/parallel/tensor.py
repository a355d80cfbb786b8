"""Tensor parallelism from scratch: Megatron-LM's column and row splits of a Linear layer.

Introduced in notebooks/11_tensor_parallelism.ipynb.

Shoeybi et al. 2019, "Megatron-LM" (arXiv:1909.08053), Sec. 3. Split a Linear ``Y = X A^T`` over
``t`` ranks in one of two ways:

* **column parallel**: each rank holds ``out/t`` rows of ``A`` (output features) and computes
  its own slice of ``Y`` from the whole ``X``. Nothing to communicate in forward; in backward
  each rank has only its part of ``dL/dX``, so they are summed: one all-reduce.
* **row parallel**: each rank holds ``in/t`` columns of ``A`` (input features) and a slice of
  ``X``; ``Y`` is the *sum* of the ranks' partial products: one all-reduce in forward; in
  backward every rank already has the whole ``dL/dY``: nothing to communicate.

Column then row (MLP: c_fc then c_proj; attention: qkv then the output projection, one group of
heads per rank) needs no communication in between: the column layer's output slice is exactly
the row layer's input slice. The two conjugate operators of the paper sit at the ends:

* ``f`` (:class:`CopyToTensorParallelRegion`): identity forward, all-reduce backward;
* ``g`` (:class:`ReduceFromTensorParallelRegion`): all-reduce forward, identity backward.

So a transformer layer costs 2 all-reduces forward (g after attention, g after the MLP) and 2
backward (f before attention, f before the MLP), each of the whole activation ``B x T x C``.

Sequence parallelism (Korthikanti et al. 2022, arXiv:2205.05198, Sec. 4.2.2): between the
tensor-parallel regions (LayerNorm, residual adds, dropout) every rank computes the same thing
on the same ``B x T x C`` tensor. Split it along the sequence instead: ``g`` becomes a
reduce-scatter (:class:`ReduceScatterToSequenceRegion`, the paper's g-bar) and ``f`` an
all-gather (:class:`AllGatherLinear`, which saves only the local chunk and gathers it again in
backward, as Megatron does, so the stored activation is split too). Bytes on the wire do not
change (reduce-scatter + all-gather = all-reduce); activation memory outside the regions is
divided by ``t``. Gradients of parameters used on sequence chunks (LayerNorms, the row layers'
biases) are then partial sums: :func:`sync_sequence_parallel_grads` all-reduces them.

What we leave out (Megatron has it): dropout (every rank would need the same masks outside the
regions and different ones inside: Megatron forks the RNG per rank; we refuse ``dropout > 0``),
a vocabulary-parallel embedding and cross-entropy (the tiny GPT's head stays replicated),
overlapping the communication with the matmuls.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from course_lib import validate
from course_lib.runtime.compat import all_gather_single, reduce_scatter_single

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
    "ColumnParallelLinear",
    "RowParallelLinear",
    "ParallelSelfAttention",
    "parallelize_gpt",
    "sync_sequence_parallel_grads",
    "gather_full",
    "check_tp",
    "valid_tp",
]


# ---- rank facts and argument checks ---------------------------------------------------------
def _facts(group) -> tuple[int, int]:
    """(tp, this rank's index in the group); (1, 0) outside a process group."""
    if not (dist.is_available() and dist.is_initialized()):
        if group is not None:
            raise RuntimeError(
                "a tensor-parallel group needs a process group: run this inside "
                "course_lib.launch(fn, world_size) (or torchrun)"
            )
        return 1, 0
    return dist.get_world_size(group), dist.get_rank(group)


def valid_tp(n: int) -> list[int]:
    """The tensor-parallel sizes that divide ``n`` (heads, hidden width) evenly."""
    return [d for d in range(1, n + 1) if n % d == 0]


def check_tp(
    config,
    tp: int,
    *,
    world_size: int | None = None,
    sequence_parallel: bool = False,
    seq: int | None = None,
) -> int:
    """Refuse a split of ``config`` (a GPTConfig or LlamaConfig) over ``tp`` ranks before any
    rank starts: heads, width and MLP width must divide by ``tp``; ``tp`` may not exceed the
    ``world_size``; with sequence parallelism the sequence must divide too. Returns ``tp``."""
    tp = validate.count("tp", tp, minimum=1)
    if world_size is not None:
        world_size = validate.count("world_size", world_size, minimum=1)
        if tp > world_size:
            raise ValueError(
                f"tp = {tp}: expected at most world_size = {world_size} "
                "(a tensor-parallel group is made of ranks that exist)"
            )
        if world_size % tp:
            raise ValueError(
                f"world_size = {world_size}: expected a multiple of tp = {tp}; "
                f"valid tp: {', '.join(map(str, valid_tp(world_size)))}"
            )
    ffn = getattr(config, "ffn_hidden", 4 * config.n_embd)
    sizes = [("n_head", config.n_head), ("n_embd", config.n_embd), ("ffn_hidden", ffn)]
    if hasattr(config, "n_kv_head"):  # grouped-query attention: the key/value heads split too
        sizes.append(("n_kv_head", config.n_kv_head))
    if sequence_parallel:
        sizes.append(("seq", config.block_size if seq is None else seq))
    for name, n in sizes:
        if n % tp:
            raise ValueError(
                f"{name} = {n} is not divisible by tp = {tp}; "
                f"valid tp: {', '.join(map(str, valid_tp(n)))}"
            )
    if getattr(config, "dropout", 0.0):
        raise ValueError(
            f"dropout = {config.dropout}: expected 0.0 (tensor parallelism here "
            "does not fork the dropout RNG per rank, as Megatron does)"
        )
    return tp


# ---- the communication, each as an autograd Function ----------------------------------------
def _all_gather(x: torch.Tensor, dim: int, group) -> torch.Tensor:
    """Every rank's ``x`` concatenated along ``dim``, in rank order."""
    t, _ = _facts(group)
    front = x.movedim(dim, 0).contiguous()  # (n, ...): all_gather_single stacks along dim 0
    out = front.new_empty((t * front.shape[0], *front.shape[1:]))
    all_gather_single(out, front, group=group)
    return out.movedim(0, dim).contiguous()


def _reduce_scatter(x: torch.Tensor, dim: int, group) -> torch.Tensor:
    """The sum over ranks of ``x``, this rank's chunk along ``dim``."""
    t, _ = _facts(group)
    front = x.movedim(dim, 0).contiguous()  # (t n, ...)
    out = front.new_empty((front.shape[0] // t, *front.shape[1:]))
    reduce_scatter_single(out, front, group=group)
    return out.movedim(0, dim).contiguous()


def _chunk(x: torch.Tensor, dim: int, group) -> torch.Tensor:
    t, r = _facts(group)
    return x.chunk(t, dim=dim)[r].contiguous()


class CopyToTensorParallelRegion(torch.autograd.Function):
    """``f``: identity in forward, all-reduce in backward (Shoeybi et al. 2019, Fig. 3)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x  # every rank already holds the whole input

    @staticmethod
    def backward(ctx, grad):  # each rank's dL/dx covers its own columns: sum them
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class ReduceFromTensorParallelRegion(torch.autograd.Function):
    """``g``: all-reduce in forward, identity in backward (Shoeybi et al. 2019, Fig. 3)."""

    @staticmethod
    def forward(ctx, x, group):
        out = x.contiguous().clone()  # (..., out): this rank's partial sum
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):  # every rank needs the whole dL/dY, and has it
        return grad, None


f = CopyToTensorParallelRegion  #: the paper's name: ``f.apply(x, group)``
g = ReduceFromTensorParallelRegion  #: the paper's name: ``g.apply(x, group)``


class GatherFromTensorParallelRegion(torch.autograd.Function):
    """All-gather along the last dim in forward; keep this rank's slice in backward
    (``ColumnParallelLinear(gather_output=True)``)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _all_gather(x, -1, group)

    @staticmethod
    def backward(ctx, grad):
        return _chunk(grad, -1, ctx.group), None


class ScatterToTensorParallelRegion(torch.autograd.Function):
    """Keep this rank's slice of the last dim in forward; all-gather in backward
    (``RowParallelLinear(input_is_parallel=False)``)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _chunk(x, -1, group)

    @staticmethod
    def backward(ctx, grad):
        return _all_gather(grad, -1, ctx.group), None


class ScatterToSequenceRegion(torch.autograd.Function):
    """Sequence parallelism: keep this rank's chunk of the sequence (dim 1) in forward,
    all-gather the chunks' gradients in backward (after the replicated embeddings)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _chunk(x, 1, group)  # (B, T/t, C)

    @staticmethod
    def backward(ctx, grad):
        return _all_gather(grad, 1, ctx.group), None


class GatherFromSequenceRegion(torch.autograd.Function):
    """All-gather the sequence chunks in forward. Backward: keep this rank's chunk when what
    follows is replicated (every rank computes the same loss: the tiny GPT's ln_f and head)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _all_gather(x, 1, group)  # (B, T, C)

    @staticmethod
    def backward(ctx, grad):
        return _chunk(grad, 1, ctx.group), None


class ReduceScatterToSequenceRegion(torch.autograd.Function):
    """The paper's g-bar (Korthikanti et al. 2022, Fig. 5): reduce-scatter along the sequence
    in forward (the row layer's partial sums, each rank keeping its chunk), all-gather in
    backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _reduce_scatter(x, 1, group)  # (B, T, C) partial -> (B, T/t, C) summed

    @staticmethod
    def backward(ctx, grad):
        return _all_gather(grad, 1, ctx.group), None


class AllGatherLinear(torch.autograd.Function):
    """The paper's g (Korthikanti et al. 2022) fused with the column layer: all-gather the
    sequence chunks, then the matmul. Saves only this rank's chunk (1/t of the input) and
    gathers it again in backward; the input's gradient leaves by reduce-scatter."""

    @staticmethod
    def forward(ctx, x, weight, bias, group):  # x: (B, T/t, in); weight: (out/t, in)
        ctx.group, ctx.has_bias = group, bias is not None
        ctx.save_for_backward(x, weight)
        return F.linear(_all_gather(x, 1, group), weight, bias)  # (B, T, out/t)

    @staticmethod
    def backward(ctx, grad):  # grad: (B, T, out/t)
        x, weight = ctx.saved_tensors
        full = _all_gather(x, 1, ctx.group)  # (B, T, in): gathered again, not stored
        grad_input = _reduce_scatter(grad @ weight, 1, ctx.group)  # (B, T/t, in)
        grad_weight = grad.flatten(0, 1).t() @ full.flatten(0, 1)  # (out/t, in)
        grad_bias = grad.flatten(0, 1).sum(0) if ctx.has_bias else None
        return grad_input, grad_weight, grad_bias, None


# ---- the two layers -------------------------------------------------------------------------
def _check_split(name: str, n: int, t: int) -> None:
    if n % t:
        raise ValueError(
            f"{name} = {n} is not divisible by tp = {t}; "
            f"valid tp: {', '.join(map(str, valid_tp(n)))}"
        )


class ColumnParallelLinear(nn.Module):
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
        group=None,
        sequence_parallel: bool = False,
        dtype=None,
        device=None,
    ):
        super().__init__()
        t, _ = _facts(group)
        self.in_features = validate.count("in_features", in_features, minimum=1)
        self.out_features = validate.count("out_features", out_features, minimum=1)
        _check_split("out_features", out_features, t)
        self.group, self.tp = group, t
        self.gather_output, self.sequence_parallel = bool(gather_output), bool(sequence_parallel)
        ref = nn.Linear(in_features, out_features // t, bias=bias, dtype=dtype, device=device)
        self.weight, self.bias = ref.weight, ref.bias
        for p in self.parameters():
            p.tp_split = (0, 1)  # (dim, chunks): how gather_full reassembles it

    @classmethod
    def from_linear(cls, linear: nn.Linear, group=None, *, chunks: int = 1, **kwargs):
        """This rank's part of an existing ``linear``. ``chunks``: the output holds that many
        blocks side by side (3 for a fused q, k, v), each split over the ranks."""
        layer = cls(
            linear.in_features,
            linear.out_features,
            bias=linear.bias is not None,
            group=group,
            dtype=linear.weight.dtype,
            device=linear.weight.device,
            **kwargs,
        )
        _, r = _facts(group)
        with torch.no_grad():
            blocks = linear.weight.chunk(chunks, dim=0)  # chunks x (out/chunks, in)
            layer.weight.copy_(torch.cat([b.chunk(layer.tp, dim=0)[r] for b in blocks]))
            if linear.bias is not None:
                layer.bias.copy_(
                    torch.cat([b.chunk(layer.tp)[r] for b in linear.bias.chunk(chunks)])
                )
        for p in layer.parameters():
            p.tp_split = (0, chunks)
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp == 1:
            y = F.linear(x, self.weight, self.bias)
        elif self.sequence_parallel:
            y = AllGatherLinear.apply(x, self.weight, self.bias, self.group)  # (B, T, out/t)
        else:
            y = F.linear(f.apply(x, self.group), self.weight, self.bias)  # (..., out/t)
        if self.gather_output and self.tp > 1:
            y = GatherFromTensorParallelRegion.apply(y, self.group)  # (..., out)
        return y

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, tp={self.tp}"
            f" (weight {tuple(self.weight.shape)} per rank)"
        )


class RowParallelLinear(nn.Module):
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
        group=None,
        sequence_parallel: bool = False,
        dtype=None,
        device=None,
    ):
        super().__init__()
        t, _ = _facts(group)
        self.in_features = validate.count("in_features", in_features, minimum=1)
        self.out_features = validate.count("out_features", out_features, minimum=1)
        _check_split("in_features", in_features, t)
        self.group, self.tp = group, t
        self.input_is_parallel, self.sequence_parallel = (
            bool(input_is_parallel),
            bool(sequence_parallel),
        )
        ref = nn.Linear(in_features // t, out_features, bias=bias, dtype=dtype, device=device)
        self.weight, self.bias = ref.weight, ref.bias
        if bias:  # nn.Linear's bound 1/sqrt(fan_in) with the full fan_in
            with torch.no_grad():
                self.bias.uniform_(-(in_features**-0.5), in_features**-0.5)
            self.bias.sequence_parallel_partial = self.sequence_parallel
        self.weight.tp_split = (1, 1)

    @classmethod
    def from_linear(cls, linear: nn.Linear, group=None, **kwargs):
        """This rank's part of an existing ``linear``."""
        layer = cls(
            linear.in_features,
            linear.out_features,
            bias=linear.bias is not None,
            group=group,
            dtype=linear.weight.dtype,
            device=linear.weight.device,
            **kwargs,
        )
        _, r = _facts(group)
        with torch.no_grad():
            layer.weight.copy_(linear.weight.chunk(layer.tp, dim=1)[r])
            if linear.bias is not None:
                layer.bias.copy_(linear.bias)
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp == 1:
            return F.linear(x, self.weight, self.bias)
        if not self.input_is_parallel:
            x = ScatterToTensorParallelRegion.apply(x, self.group)  # (..., in/t)
        y = F.linear(x, self.weight)  # (..., out): this rank's partial sum
        if self.sequence_parallel:
            y = ReduceScatterToSequenceRegion.apply(y, self.group)  # (B, T/t, out)
        else:
            y = g.apply(y, self.group)  # (..., out): the sum over ranks
        return y + self.bias if self.bias is not None else y

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, tp={self.tp}"
            f" (weight {tuple(self.weight.shape)} per rank)"
        )


# ---- the tiny GPT, split ---------------------------------------------------------------------
class ParallelSelfAttention(nn.Module):
    """``models.CausalSelfAttention`` over this rank's ``n_head/t`` heads: qkv column-parallel
    (the fused q, k, v split head-wise, 3 chunks), output projection row-parallel. Heads are
    independent, so nothing is communicated in between. Also used with ``nn.Linear`` layers
    whose qkv rows are ordered rank by rank (DTensor's ColwiseParallel, see unit 11's run)."""

    def __init__(self, c_attn: nn.Module, c_proj: nn.Module, head_size: int, causal_mask):
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
        att = att.masked_fill(self.causal_mask[:T, :T], float("-inf"))
        att = F.softmax(att, dim=-1)
        y = att @ v  # (B, nh/t, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, -1)  # (B, T, C/t)
        return self.c_proj(y)  # (B, T, C) after g, or (B, T/t, C) after the reduce-scatter


def parallelize_gpt(model, group=None, *, sequence_parallel: bool = False):
    """Split the tiny GPT (``models.GPT``) in place over the ranks of ``group`` (all ranks by
    default; outside a process group it is the identity split, tp = 1) and return it.

    Per block: attention qkv ``ColumnParallelLinear`` (heads split), output projection
    ``RowParallelLinear``; MLP c_fc column-parallel, c_proj row-parallel. Embeddings, LayerNorms
    and the (tied) head stay replicated. ``sequence_parallel``: the residual stream between the
    blocks' parallel regions is split along the sequence (call
    :func:`sync_sequence_parallel_grads` after backward). Every rank must pass the same model."""
    t, _ = _facts(group)
    check_tp(model.config, t, sequence_parallel=sequence_parallel)
    sp = bool(sequence_parallel) and t > 1
    hs = model.config.n_embd // model.config.n_head
    for block in model.blocks:
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
            for p in [*block.ln_1.parameters(), *block.ln_2.parameters()]:
                p.sequence_parallel_partial = True
    if sp:  # split the stream after the embeddings, gather it before the replicated head
        model.blocks[0].register_forward_pre_hook(
            lambda m, args: (ScatterToSequenceRegion.apply(args[0], group),)
        )
        model.ln_f.register_forward_pre_hook(
            lambda m, args: (GatherFromSequenceRegion.apply(args[0], group),)
        )
    model.tp_group, model.tp, model.sequence_parallel = group, t, sp
    return model


def sync_sequence_parallel_grads(model, group=None) -> int:
    """Sum over the ranks the gradients of parameters used on sequence chunks (LayerNorms in
    the blocks, the row layers' biases), in one flattened all-reduce. Returns the calls made."""
    grads = [
        p.grad
        for p in model.parameters()
        if getattr(p, "sequence_parallel_partial", False) and p.grad is not None
    ]
    if not grads or _facts(group)[0] == 1:
        return 0
    flat = torch.cat([gr.reshape(-1) for gr in grads])
    dist.all_reduce(flat, group=group)
    for gr, part in zip(grads, flat.split([gr.numel() for gr in grads])):
        gr.copy_(part.view_as(gr))
    return 1


def gather_full(model, which: str = "param", group=None) -> dict[str, torch.Tensor]:
    """``{name: full tensor}`` of a split model's parameters (``which="param"``) or gradients
    (``"grad"``), in the names and shapes of the unsplit model (a collective: call it on every
    rank). The harness's ``gather_fn`` for tensor parallelism."""
    which = validate.choice("which", which, ("param", "grad"))
    t, _ = _facts(group)
    out = {}
    for name, p in model.named_parameters():
        x = p if which == "param" else p.grad
        if x is None:
            continue
        x = x.detach()
        split = getattr(p, "tp_split", None)
        if split is not None and t > 1:
            dim, chunks = split
            parts = [torch.empty_like(x) for _ in range(t)]
            dist.all_gather(parts, x.contiguous(), group=group)
            blocks = [part.chunk(chunks, dim=dim) for part in parts]  # rank x chunk
            x = torch.cat(
                [torch.cat([b[c] for b in blocks], dim=dim) for c in range(chunks)], dim=dim
            )
        out[name] = x.to("cpu", copy=True)
    return out
