"""Tensor parallelism from scratch: Megatron-LM's column and row splits of a Linear layer
(notebooks/11_tensor_parallelism.ipynb). The communications are in ``comms.py``.

Shoeybi et al. 2019 (arXiv:1909.08053), Sec. 3: split ``Y = X A^T`` over ``t`` ranks in two ways:

* **column parallel**: each rank holds ``out/t`` rows of ``A`` (output features) and computes
  its own slice of ``Y`` from the whole ``X``. Nothing to communicate in forward; in backward
  each rank has only its part of ``dL/dX``, so they are summed (``f``: one all-reduce).
* **row parallel**: each rank holds ``in/t`` columns of ``A`` (input features) and a slice of
  ``X``; ``Y`` is the *sum* of the ranks' partial products (``g``: one all-reduce in forward);
  in backward every rank already has the whole ``dL/dY``.

Column then row (MLP: c_fc then c_proj; attention: qkv then the output projection, one group of
heads per rank) needs no communication in between: 2 all-reduces forward and 2 backward per
layer. Sequence parallelism (Korthikanti et al. 2022): see ``comms.py``.

Left out (Megatron has it): dropout (Megatron forks the RNG per rank), a vocabulary-parallel
embedding and cross-entropy, overlapping the communication with the matmuls.
"""

from __future__ import annotations

from course_lib.parallel.tensor.checks import check_tp, valid_tp
from course_lib.parallel.tensor.comms import (
    AllGatherLinear,
    CopyToTensorParallelRegion,
    GatherFromSequenceRegion,
    GatherFromTensorParallelRegion,
    ReduceFromTensorParallelRegion,
    ReduceScatterToSequenceRegion,
    ScatterToSequenceRegion,
    ScatterToTensorParallelRegion,
    f,
    g,
    gather_full,
    sync_sequence_parallel_grads,
)
from course_lib.parallel.tensor.layers import (
    ColumnParallelLinear,
    ParallelSelfAttention,
    RowParallelLinear,
    parallelize_gpt,
)

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
