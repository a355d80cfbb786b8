"""Activation checkpointing for the blocks of the tiny GPT: full, every k-th block, selective, segments.

Introduced in notebooks/06_activation_checkpointing.ipynb. Everything here wraps PyTorch's own
``torch.utils.checkpoint.checkpoint`` (non-reentrant, the variant PyTorch recommends); nothing
re-implements autograd. A checkpointed block keeps only its input for backward and runs its
forward a second time inside backward to rebuild what it needs. Policies:

==============  ==================================================================================
``none``        nothing changes: every block keeps what autograd saves (16 BTC + 4 BT + nh B T^2
                values per block in our fp32 GPT; ``estimate.activation_bytes_gpt``)
``full``        every block is checkpointed: keeps its input (1 BTC), recomputes everything
``every_k``     blocks 0, k, 2k, ... are checkpointed, the others keep their activations
``selective``   every block is checkpointed with a selective policy
                (``torch.utils.checkpoint.create_selective_checkpoint_contexts``): the outputs of
                the ops in ``save_ops`` (by default the matmuls ``mm``/``addmm``/``bmm``) are kept
                in forward and reused in backward, the cheap elementwise ops (LayerNorm, softmax,
                GELU, the copies) are recomputed
``segments``    k consecutive blocks form one checkpoint (Chen et al. 2016, arXiv:1604.06174):
                keeps ceil(L/k) segment inputs and, in backward, rebuilds one segment at a time
==============  ==================================================================================

``apply_checkpointing(model, policy, k=...)`` changes ``model.blocks`` in place (the parameters,
their order and their values stay the same; only module names gain a ``.blocks.i`` level inside a
wrapper) and returns the model; ``remove_checkpointing(model)`` undoes it.

Why the RNG state matters: a block with dropout draws random masks in forward. Its recomputation
must draw the *same* masks, or backward differentiates a different function from the one forward
computed. ``checkpoint(..., preserve_rng_state=True)`` (the default) saves the RNG state before
the forward and restores it for the recomputation; ``False`` is only safe without randomness.
"""

from __future__ import annotations

import functools
from typing import TypeVar

import torch
from torch import nn
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

from course_lib import validate
from course_lib.measure.estimate.checkpointing import CHECKPOINT_POLICIES

__all__ = [
    "POLICIES",
    "MATMUL_OPS",
    "SAVE_OP_CHOICES",
    "Checkpointed",
    "selective_policy",
    "apply_checkpointing",
    "remove_checkpointing",
    "checkpoint_layout",
]

#: the policies of :func:`apply_checkpointing`
#: a model with ``blocks`` (``course_lib.models.GPT``); the functions return the same model
ModelT = TypeVar("ModelT", bound=nn.Module)

POLICIES = CHECKPOINT_POLICIES  # "none", "full", "every_k", "selective", "segments" (estimate's)
#: what the default selective policy keeps: the outputs of the matrix products
MATMUL_OPS = ("mm", "addmm", "bmm")
#: aten ops a selective policy may be asked to keep (by their overload packet name)
SAVE_OP_CHOICES = (
    "mm",
    "addmm",
    "bmm",
    "baddbmm",
    "_softmax",
    "gelu",
    "native_layer_norm",
    "add",
    "mul",
)


def _resolve_ops(save_ops) -> frozenset:
    names = validate.choices("save_ops", save_ops, SAVE_OP_CHOICES)
    # the policy sees OpOverloads (aten.mm.default), not packets (aten.mm): compare packets
    return frozenset(getattr(torch.ops.aten, n) for n in names)


def selective_policy(save_ops=MATMUL_OPS):
    """A ``context_fn`` for ``checkpoint``: keep the outputs of ``save_ops``, recompute the rest.

    ``MUST_SAVE`` for an op in ``save_ops``, ``PREFER_RECOMPUTE`` for every other op. Use as
    ``checkpoint(fn, x, use_reentrant=False, context_fn=selective_policy())``.
    """
    packets = _resolve_ops(save_ops)

    def policy(ctx, op, *args, **kwargs):
        return (
            CheckpointPolicy.MUST_SAVE
            if op.overloadpacket in packets
            else CheckpointPolicy.PREFER_RECOMPUTE
        )

    return functools.partial(create_selective_checkpoint_contexts, policy)


class Checkpointed(nn.Module):
    """Runs ``blocks`` one after the other inside one ``torch.utils.checkpoint.checkpoint``."""

    def __init__(self, blocks, *, context_fn=None, preserve_rng_state: bool = True):
        super().__init__()
        self.blocks = nn.ModuleList(blocks)
        self.context_fn = context_fn
        self.preserve_rng_state = bool(preserve_rng_state)

    def _run(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, T, C)
        for block in self.blocks:
            x = block(x)
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kwargs = {"context_fn": self.context_fn} if self.context_fn is not None else {}
        # use_reentrant=False: the variant PyTorch recommends (works with inputs that need no
        # grad, with torch.autograd.grad, and is the only one that takes a context_fn)
        return checkpoint(
            self._run, x, use_reentrant=False, preserve_rng_state=self.preserve_rng_state, **kwargs
        )


def checkpoint_layout(n_layer: int, policy: str, *, k: int = 1) -> list[tuple[int, ...]]:
    """Which blocks share a checkpoint: a list of tuples of block indices, one per checkpoint.

    >>> checkpoint_layout(5, "every_k", k=2)
    [(0,), (2,), (4,)]
    >>> checkpoint_layout(5, "segments", k=2)
    [(0, 1), (2, 3), (4,)]
    """
    n = validate.count("n_layer", n_layer, minimum=1)
    policy = validate.choice("policy", policy, POLICIES)
    k = validate.count("k", k, minimum=1, maximum=n)
    if policy == "none":
        return []
    if policy in ("full", "selective"):
        if k != 1:
            raise ValueError(
                f"k = {k}: expected 1 with policy = {policy!r} (every block is "
                "checkpointed; use policy 'every_k' or 'segments' with k > 1)"
            )
        return [(i,) for i in range(n)]
    if policy == "every_k":
        return [(i,) for i in range(0, n, k)]
    return [tuple(range(i, min(i + k, n))) for i in range(0, n, k)]  # segments


def apply_checkpointing(
    model: ModelT,
    policy: str,
    *,
    k: int = 1,
    save_ops=MATMUL_OPS,
    preserve_rng_state: bool = True,
) -> ModelT:
    """Checkpoint the blocks of ``model`` (anything with an ``nn.ModuleList`` called ``blocks``
    whose forward calls each block in turn, such as ``course_lib.models.GPT``), in place.

    policy: one of :data:`POLICIES`; k: the spacing for ``every_k``, the segment length for
    ``segments`` (1 <= k <= number of blocks; must be 1 for ``full`` and ``selective``);
    save_ops: the ops whose outputs ``selective`` keeps (names from :data:`SAVE_OP_CHOICES`);
    preserve_rng_state: passed to ``checkpoint`` (keep True when a block uses dropout).
    Returns ``model``. Gradients equal those of the unchanged model (tests/techniques).
    """
    blocks = _blocks(model)
    if any(isinstance(b, Checkpointed) for b in blocks):
        raise ValueError("model is already checkpointed; call remove_checkpointing(model) first")
    layout = checkpoint_layout(len(blocks), policy, k=k)
    context_fn = selective_policy(save_ops) if policy == "selective" else None
    if policy != "selective":
        _resolve_ops(save_ops)  # a bad save_ops is an error whatever the policy
    starts = {group[0]: group for group in layout}
    new, i = [], 0
    while i < len(blocks):
        group = starts.get(i)
        if group is None:
            new.append(blocks[i])
            i += 1
            continue
        new.append(
            Checkpointed(
                [blocks[j] for j in group],
                context_fn=context_fn,
                preserve_rng_state=preserve_rng_state,
            )
        )
        i += len(group)
    model.blocks = nn.ModuleList(new)
    return model


def _blocks(model: nn.Module) -> nn.ModuleList:
    blocks = getattr(model, "blocks", None)
    if not isinstance(blocks, nn.ModuleList):
        raise TypeError(
            f"model must have an nn.ModuleList 'blocks' (e.g. course_lib.models.GPT), "
            f"got {type(model).__name__}"
        )
    return blocks


def remove_checkpointing(model: ModelT) -> ModelT:
    """Undo :func:`apply_checkpointing`: ``model.blocks`` holds the plain blocks again."""
    blocks: list[nn.Module] = []
    for b in _blocks(model):
        blocks.extend(b.blocks if isinstance(b, Checkpointed) else [b])
    model.blocks = nn.ModuleList(blocks)
    return model
