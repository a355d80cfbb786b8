"""Context parallelism: split the sequence over ranks, and make attention see all of it.

Everything outside attention (embeddings, norms, MLP, the loss) works token by token, so a
rank can hold ``s / W`` tokens and run it unchanged. Attention is the exception: every query
needs every key before it. Three ways to give it them, each an autograd Function whose backward
uses the same communication pattern (nothing is all-gathered for backward):

* :func:`ring_attention` (``ring.py``): K/V blocks travel around a ring, partial
  results merge by log-sum-exp (Liu et al. 2023, arXiv:2310.01889);
* :func:`allgather_kv_attention` (``gather.py``): all-gather K/V once, the local
  queries attend (Llama Team 2024, arXiv:2407.21783, Sec. 3.3.2);
* :func:`ulysses_attention` (``gather.py``): all-to-all from a sequence split to a
  head split and back (Jacobs et al. 2023, arXiv:2309.14509).

Layouts (``layout.py``): :func:`shard_sequence` / :func:`unshard_sequence`,
"contiguous" or "zigzag". The block math and the online-softmax merge: ``blocks.py``.
:func:`parallelize_context` turns the course's GPT into a context-parallel one (each rank feeds
its shard of the tokens; :func:`sync_context_grads` averages the replicated weights'
gradients). Introduced in notebooks/15_context_parallelism.ipynb.
"""

from __future__ import annotations

from course_lib.parallel.context.attention import (
    METHODS,
    ContextParallelAttention,
    Method,
    context_attention,
    parallelize_context,
    sync_context_grads,
)
from course_lib.parallel.context.blocks import (
    attention_block,
    attention_block_backward,
    merge_attention,
)
from course_lib.parallel.context.gather import allgather_kv_attention, ulysses_attention
from course_lib.parallel.context.layout import (
    LAYOUTS,
    Layout,
    check_qkv,
    chunks_per_rank,
    positions,
    segments,
    shard_sequence,
    unshard_sequence,
)
from course_lib.parallel.context.ring import ring_attention

__all__ = [
    "Layout",
    "LAYOUTS",
    "Method",
    "METHODS",
    "shard_sequence",
    "unshard_sequence",
    "segments",
    "positions",
    "chunks_per_rank",
    "check_qkv",
    "attention_block",
    "attention_block_backward",
    "merge_attention",
    "ring_attention",
    "allgather_kv_attention",
    "ulysses_attention",
    "context_attention",
    "ContextParallelAttention",
    "parallelize_context",
    "sync_context_grads",
]
