"""The model a virtual-cluster simulation traces: built, tensor-parallelised, checkpointed and
sharded in torchtitan's order, and its optimizer with the state a second step would find.
Part of ``virtual/_rank.py``; introduced in notebooks/10_zero_fsdp.ipynb.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn

from course_lib.virtual._types import Checkpoint, SimSpec


def _blocks(model: nn.Module) -> list[nn.Module]:
    layers = getattr(model, "layers", None)
    return list(layers) if isinstance(layers, nn.ModuleList) else []


def _tp_plan(model: nn.Module) -> dict:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    # Megatron split (Shoeybi et al. 2019): column-parallel in, row-parallel out, so each
    # attention and each MLP needs one all-reduce forward (after wo / w2) and one backward.
    return {
        "wq": ColwiseParallel(),
        "wk": ColwiseParallel(),
        "wv": ColwiseParallel(),
        "wo": RowwiseParallel(),
        "w1": ColwiseParallel(),
        "w3": ColwiseParallel(),
        "w2": RowwiseParallel(),
    }


def build(spec: SimSpec, mesh: Any) -> tuple[nn.Module, torch.dtype | None]:
    """Model with the strategy's wrappers applied; returns (model, autocast context or None)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    strategy, mp = spec.strategy, spec.mixed_precision
    model = spec.model_fn()
    if not isinstance(model, nn.Module):
        raise TypeError(f"model_fn() = a {type(model).__name__}: expected a torch.nn.Module")
    param_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(mp or "")
    policy = MixedPrecisionPolicy(
        param_dtype=param_dtype, reduce_dtype=torch.float32 if mp else None
    )
    autocast = None
    if strategy in ("tp", "fsdp+tp"):
        from torch.distributed.tensor.parallel import parallelize_module

        tp_mesh = mesh["tp"] if strategy == "fsdp+tp" else mesh
        for block in _blocks(model):
            parallelize_module(block, tp_mesh, _tp_plan(block))
    # torchtitan's order: tensor parallelism, then checkpointing, then FSDP (which shards the
    # checkpoint wrappers)
    _apply_checkpointing(model, spec.checkpoint)
    if strategy in ("fsdp", "fsdp_no_reshard", "fsdp+tp"):
        dp_mesh = mesh["dp"] if strategy == "fsdp+tp" else mesh
        reshard = spec.reshard_after_forward and strategy != "fsdp_no_reshard"
        for block in _blocks(model):
            fully_shard(block, mesh=dp_mesh, mp_policy=policy, reshard_after_forward=reshard)
        fully_shard(model, mesh=dp_mesh, mp_policy=policy, reshard_after_forward=reshard)
    elif strategy == "ddp":
        from torch.distributed._composable.replicate_with_fsdp import replicate

        for block in _blocks(model):
            replicate(block, mesh=mesh, mp_policy=policy)
        replicate(model, mesh=mesh, mp_policy=policy)
    elif param_dtype is not None:  # tp: no FSDP policy to cast with; autocast does it per op
        autocast = param_dtype
    return model, autocast


#: aten ops whose outputs the "selective" policy keeps (torchtitan's op-level list: the matmuls
#: and the fused attention, whose CPU kernel is the flash one; everything else is recomputed)
SELECTIVE_SAVE = (
    "mm",
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention",
)


def _selective_context():
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    keep = {getattr(torch.ops.aten, n) for n in SELECTIVE_SAVE if hasattr(torch.ops.aten, n)}

    def policy(ctx, op, *args, **kwargs):
        return (
            CheckpointPolicy.MUST_SAVE
            if op.overloadpacket in keep
            else CheckpointPolicy.PREFER_RECOMPUTE
        )

    return create_selective_checkpoint_contexts(policy)


def _apply_checkpointing(model: nn.Module, policy: Checkpoint) -> None:
    """Wrap every block of ``model.layers`` in ``checkpoint_wrapper`` (non-reentrant
    ``torch.utils.checkpoint``, what torchtitan's ``apply_ac`` uses); None: nothing.

    ``full``: a block keeps only its inputs and runs its forward again in backward.
    ``selective``: the outputs of :data:`SELECTIVE_SAVE` are kept too, the rest is recomputed.

    Applied before ``fully_shard`` / ``replicate``, which then wrap the checkpoint wrappers (as
    torchtitan does). The rebuilt tensors exist during backward, where the trackers file them
    under temporaries (FSDPMemTracker files them as activations only when the recomputation
    enters an FSDP module's pre-forward, i.e. with the wrapper around a sharded block: same
    bytes, same collectives); ``activation_peak_bytes`` counts both categories.
    """
    if policy is None:
        return
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl,
        checkpoint_wrapper,
    )

    layers = getattr(model, "layers", None)
    if not isinstance(layers, nn.ModuleList) or not len(layers):
        raise TypeError(
            f"checkpoint = {policy!r}: expected a model with a ModuleList "
            f"model.layers of blocks to checkpoint; {type(model).__name__} has none"
        )
    extra = {"context_fn": _selective_context} if policy == "selective" else {}
    for i, block in enumerate(layers):
        layers[i] = checkpoint_wrapper(
            block, checkpoint_impl=CheckpointImpl.NO_REENTRANT, preserve_rng_state=False, **extra
        )


def make_optimizer(name: str, params) -> torch.optim.Optimizer:
    # foreach kernels refuse a list that mixes DTensors (tensor-parallel weights) with plain
    # tensors (replicated norms and embeddings): one parameter group for each kind
    params = list(params)
    dtensors = [p for p in params if hasattr(p, "to_local")]
    plain = [p for p in params if not hasattr(p, "to_local")]
    params = [{"params": g} for g in (dtensors, plain) if g]
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-4, foreach=True)
    if name == "adam":
        return torch.optim.Adam(params, lr=1e-4, foreach=True)
    return torch.optim.SGD(params, lr=1e-2, foreach=True)


def prime_optimizer(opt: torch.optim.Optimizer) -> None:
    """Create the optimizer state before the measured step, as on any step after the first.

    torch.optim makes Adam's state lazily in the first ``step()``, so without this the measured
    step's backward peak would miss 8 B/param. We make exactly what ``Adam._init_group`` makes
    for a non-fused, non-capturable Adam: ``step`` (a 0-dim fp32 tensor), ``exp_avg`` and
    ``exp_avg_sq`` (``zeros_like`` the parameter: a DTensor shard under FSDP/TP), so the step
    finds its state and creates none (tests check the total: 2 x params + 4 B per tensor).
    A priming ``step()`` on zero gradients would do the same at ~5x the cost under DTensor.
    SGD without momentum keeps no state.
    """
    if not isinstance(opt, torch.optim.Adam | torch.optim.AdamW):
        return
    with torch.no_grad():
        for group in opt.param_groups:
            for p in group["params"]:
                opt.state[p] = {
                    "step": torch.tensor(0.0, dtype=torch.float32),
                    "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                    "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format),
                }
