"""Every analytic formula the course uses, in one place, each with its source.

Notebooks predict with these functions and then measure; because every chapter calls the same
function, two chapters can never disagree about a number. One quantity, one function: per-layer
activations are :func:`activation_bytes_transformer_layer` (tensor and sequence parallelism,
recomputation included), training FLOPs per token :func:`training_flops_per_token`.

Units
-----
* Memory and traffic are in **bytes**. Results are ``int`` where the count is exact and a
  ``float`` only where a division does not come out even (said in each docstring).
* ``GB`` means 10**9 bytes (what papers and vendors quote), ``GiB`` means 2**30 bytes (what
  ``torch.cuda.memory_allocated`` style tools usually print). ``fmt_bytes`` says which it uses.
* Bandwidths are bytes per second unless a name ends in ``GBps`` (10**9 bytes per second).
* Times are seconds; FLOPs are floating-point operations (a multiply-add counts as 2).

Keywords
--------
Every function names the same thing the same way:

* shape: ``batch`` (sequences per batch or micro-batch, b), ``seq`` (tokens per sequence, s),
  ``hidden`` (model width, h), ``heads`` (attention heads, a), ``kv_heads`` (key/value heads
  under grouped-query attention; default ``heads``), ``ffn`` (MLP inner width, f; default 4h),
  ``gated_mlp`` (SwiGLU), ``layers`` (transformer layers, L), ``vocab`` (V), ``n_params`` (N),
  ``tokens`` (D); ``kv_hidden`` is the width of K and V, h x kv_heads / heads;
* parallelism: ``tp`` (tensor-parallel ranks, t), ``sequence_parallel`` (default ``False``
  everywhere: a caller says when it wants it), ``world_size`` (ranks of a collective or a
  data-parallel group, N), ``stages`` (pipeline stages, p), ``microbatches`` (m),
  ``virtual_stages`` (interleaved chunks per rank, v), ``stage`` (a ZeRO stage, 0-3),
  ``cp`` (context-parallel ranks: the sequence split over them), ``rank`` (one rank of them),
  ``ep`` (expert-parallel ranks: the routed experts split over them);
* FP8: ``scaling`` (:data:`Fp8Scaling`: "tensorwise", "rowwise", "blockwise"), ``block`` (tile
  width of blockwise scaling) and ``block_rows``, ``gather`` (:data:`Gather`: what FSDP's
  all-gather carries, "fp32", "bf16", "fp8");
* mixture of experts: ``experts`` (routed experts per layer, E), ``top_k`` (experts per token,
  k), ``shared_experts`` (experts every token uses), ``capacity_factor`` (expert capacity over
  the even share), ``routed`` (a ranks x experts table of assignments sent);
* widths: ``dtype_bytes`` (bytes of one value of the tensors counted: 4 fp32, 2 bf16/fp16;
  :func:`dtype_bytes` turns a dtype into it); ``param_bytes``, ``grad_bytes``, ``state_bytes``
  and ``state_dtype_bytes`` where one count has several widths;
* variants, each a ``Literal`` with its tuple: ``recompute`` (:data:`Recompute`: "none",
  "selective", "full"), ``policy`` (:data:`CheckpointPolicy`), ``precision``
  (:data:`Precision`), ``optimizer`` (:data:`Optimizer`), ``activation``, ``norm``, ``level``,
  ``method``, ``collective``, ``algorithm``, ``layout`` (:data:`CpLayout`: "contiguous",
  "zigzag"); context parallelism's ``method`` is :data:`CpMethod` ("ring", "allgather",
  "ulysses");
* failures and checkpoints: ``save_s`` (delta: seconds the run is blocked writing one
  checkpoint), ``mtbf_s`` (M: mean time between failures of the whole job), ``restart_s`` (R:
  detection, re-queue, process-group start-up and checkpoint load per failure), ``interval_s``
  (tau: seconds of training between checkpoints), ``method`` (:data:`IntervalMethod`: "young",
  "daly"), ``duration_s``, ``interruptions``;
* hardware: ``peak_flops`` (FLOP/s), ``mfu`` (0-1), ``size_bytes`` (a message),
  ``*_GBps`` (link speeds; ``link_GBps`` is one link's GB/s per direction), ``alpha_s`` (a
  message's latency, s);
* thresholds: ``tokens`` is also tokens per GPU in one step or micro-batch, ``target`` a
  fraction to stay below.

A model's shape is one object, ``course_lib.shape.ModelShape`` (``GPTConfig.shape()``,
``LlamaConfig.shape()``, a ``plan.ModelSpec``), whose fields carry these names:
``transformer_param_count(**shape.dense())``. Formulas of the course's own tiny GPT take its
``config`` (a ``models.GPTConfig``). Old names kept one release beside the one function of their
quantity: :func:`gpt_param_count` (:func:`transformer_param_count`),
:func:`tp_payload_bytes_per_layer` (:func:`tp_comm_bytes_per_layer`'s ``payloads``),
:func:`gpus_for_training` (:func:`gpus_for_days`), :func:`training_days` (:func:`gpu_hours`).
Every argument
is checked with ``course_lib.validate`` (``name = value: expected ...``).

This module imports nothing heavy (no torch), so it can be used anywhere, including in
planning cells that never touch a tensor. Introduced across the units; the memory formulas in
notebooks/01_backprop_memory.ipynb and notebooks/04_optimizer_memory.ipynb, the communication
formulas in notebooks/08_collectives.ipynb and notebooks/13_interconnects_and_backends.ipynb,
the roofline in notebooks/02_batch_size_and_accumulation.ipynb.

The formulas live in one module per topic, all importable as ``estimate.<name>``:
``units`` (byte units, formatting), ``memory`` (dtypes, model and optimizer state), ``zero``
(ZeRO sharding per rank), ``activations`` (activation bytes of the MLP, a transformer layer
under tensor / sequence parallelism and recomputation, our GPT), ``communication`` (bytes each
rank sends), ``links`` (alpha-beta time models, link speeds, hierarchical all-reduce, DDP
overlap), ``compute`` (FLOPs, roofline, bubble), ``offload`` (what offload keeps where, moves
and costs per step), ``checkpointing`` (bytes kept and FLOPs recomputed per checkpointing
policy), ``lora`` (LoRA parameter counts, NF4 bytes, fine-tuning memory), ``training``
(parameter counts, FLOPs per token, MFU, GPUs for a run, accelerator specs, memory tiers,
learning rate against the batch), ``tensor_parallel`` (parameters and communication per rank),
``context`` (context parallelism: bytes per rank of ring, all-gather and Ulysses attention,
activations with the sequence split, causal work per rank), ``moe`` (mixture of experts:
parameters total and active, capacity, expert parallelism's all-to-all bytes, memory per GPU
under EP x ZeRO), ``planning`` (real architectures'
parameter counts, pipeline in-flight layers, GPU-days),
``fp8`` (FP8 formats, bytes of a scaled cast, FP8 all-gather bytes and memory under FSDP, the
share of a step FP8 speeds up), ``failures`` (Young's and Daly's checkpoint intervals,
goodput with restart cost, a job's MTBF, checkpoint bytes) and ``overlap`` (when each
parallelism's communication hides behind compute: the tokens, hidden size or micro-batches at
which it does, each a ratio of FLOP/s to a link's bytes/s per direction times a shape factor).
"""

from __future__ import annotations

from course_lib.measure.estimate import (  # noqa: E402
    activations,
    checkpointing,
    communication,
    compute,
    context,
    failures,
    fp8,
    links,
    lora,
    memory,
    moe,
    offload,
    overlap,
    planning,
    tensor_parallel,
    training,
    units,
    zero,
)
from course_lib.measure.estimate.activations import *  # noqa: F401,F403
from course_lib.measure.estimate.checkpointing import *  # noqa: F401,F403
from course_lib.measure.estimate.communication import *  # noqa: F401,F403
from course_lib.measure.estimate.compute import *  # noqa: F401,F403
from course_lib.measure.estimate.context import *  # noqa: F401,F403
from course_lib.measure.estimate.failures import *  # noqa: F401,F403
from course_lib.measure.estimate.fp8 import *  # noqa: F401,F403
from course_lib.measure.estimate.links import *  # noqa: F401,F403
from course_lib.measure.estimate.lora import *  # noqa: F401,F403
from course_lib.measure.estimate.memory import *  # noqa: F401,F403
from course_lib.measure.estimate.moe import *  # noqa: F401,F403
from course_lib.measure.estimate.offload import *  # noqa: F401,F403
from course_lib.measure.estimate.overlap import *  # noqa: F401,F403
from course_lib.measure.estimate.planning import *  # noqa: F401,F403
from course_lib.measure.estimate.tensor_parallel import *  # noqa: F401,F403
from course_lib.measure.estimate.training import *  # noqa: F401,F403
from course_lib.measure.estimate.units import *  # noqa: F401,F403
from course_lib.measure.estimate.units import exact  # noqa: F401
from course_lib.measure.estimate.zero import *  # noqa: F401,F403

__all__ = [
    *units.__all__,
    *memory.__all__,
    *zero.__all__,
    *activations.__all__,
    *communication.__all__,
    *links.__all__,
    *compute.__all__,
    *offload.__all__,
    *checkpointing.__all__,
    *lora.__all__,
    *training.__all__,
    *tensor_parallel.__all__,
    *context.__all__,
    *moe.__all__,
    *planning.__all__,
    *fp8.__all__,
    *failures.__all__,
    *overlap.__all__,
]
