"""ZeRO from scratch: data parallelism that shards the model state instead of replicating it.
Introduced in notebooks/10_zero_fsdp.ipynb.

Plain data parallelism (unit 09) keeps on every rank the parameters, the gradients and the
optimizer state: with Adam in fp32 that is 4 + 4 + 8 = 16 bytes per parameter, N times over.
ZeRO (Rajbhandari et al. 2019, "ZeRO: Memory Optimizations Toward Training Trillion Parameter
Models", arXiv:1910.02054, Sec. 5) notices that each rank only needs *its slice* of the optimizer
state to update *its slice* of the parameters, and goes in three stages:

* stage 1 (P_os) shards the optimizer state: after backward, a **reduce-scatter** leaves rank r
  the averaged gradient of its slice; r updates that slice; an **all-gather** of the updated
  slices gives every rank the full new parameters. Reduce-scatter + all-gather move exactly what
  DDP's all-reduce moves, 2(N-1)/N x Psi elements per rank;
* stage 2 (P_os+g) also shards the gradients: each layer's gradients are reduce-scattered as soon
  as backward has produced them, and the full gradients are freed; the same bytes as stage 1;
* stage 3 (P_os+g+p, what PyTorch calls FSDP) also shards the parameters: a layer's parameters
  are all-gathered just before its forward and freed after it, gathered *again* before its
  backward, and freed once its gradients are reduce-scattered: 3(N-1)/N x Psi per rank, 1.5x DDP.
  ``reshard_after_forward=False`` keeps the gathered parameters from forward to backward (one
  all-gather fewer, the full parameters of every layer alive at the end of forward: torch's
  ``fully_shard(reshard_after_forward=False)``); ``prefetch=True`` issues the next layer's
  all-gather asynchronously while the current layer computes.

Stage 0 is plain data parallelism (one all-reduce per parameter tensor in ``step()``), for
comparison.

The code: ``common.py`` (the flat padded layout every stage shares), ``sharded.py``
(stages 0-2, :class:`ShardedOptimizer`), ``full.py`` (stage 3, :class:`FullySharded`).
``ZeroDataParallel(module, stage=s)`` makes the one that runs stage ``s``. Stage 3 placed on nodes
(HSDP, ZeRO++): ``hybrid.py``.

What we leave out (DeepSpeed / torch's FSDP2 have it): mixed precision (bf16 compute copies of an
fp32 master shard), overlapping the reduce-scatter with backward (ours is synchronous, in the
hook), buckets spanning several layers, CPU offload, and recording the forward order of the first
step (our prefetch assumes units run in registration order, true of ``nn.Sequential``-like
models), and modules called more than once per forward (shared weights) at stage 3.

Reduce-scatter on gloo. gloo's ``reduce_scatter`` sends what an all-reduce sends, 2(N-1)/N x S
per rank, twice the ring's (N-1)/N x S (measured: torch's ``fully_shard``, which uses it, puts 2x
DDP's bytes on the wire per step instead of 1.5x; notebooks/10_zero_fsdp.ipynb, section 5). So on
gloo we reduce-scatter with the course's ring (``collectives.ring_reduce_scatter``, unit 08), and
with torch's on other backends (NCCL's is a ring).
"""

from __future__ import annotations

from course_lib.parallel.zero.common import STAGES, ZeroDataParallel, full_tensors, shard_numel
from course_lib.parallel.zero.full import FullySharded
from course_lib.parallel.zero.sharded import ShardedOptimizer

__all__ = [
    "ZeroDataParallel",
    "ShardedOptimizer",
    "FullySharded",
    "STAGES",
    "full_tensors",
    "shard_numel",
]
