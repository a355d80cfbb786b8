"""Data parallelism from scratch: every rank holds the whole model, trains on its own slice of
the batch, and averages the gradients with all-reduce before the optimizer step.
Introduced in notebooks/09_data_parallelism.ipynb.

Why it trains the same model as one process: the loss is a mean over the batch, so the gradient
of the full batch is the mean of the gradients of N equal slices. If every replica starts from
the same parameters (a broadcast from rank 0) and applies the same averaged gradient, the
replicas stay identical, step after step: the *ordering invariant* of synchronous data
parallelism. One all-reduce per step is the whole price: 2(N-1)/N x (gradient bytes) sent by
each rank with a ring (``estimate.ring_allreduce_bytes_sent``).

Read the two versions in order:

* :func:`allreduce_gradients`, the naive one: after ``loss.backward()`` has finished, one
  blocking all-reduce per parameter. Correct, but it pays the latency of one call per tensor,
  and the network idles during backward while the compute idles during communication.
* :class:`DataParallel`, what ``torch.nn.parallel.DistributedDataParallel`` does (Li et al.
  2020, "PyTorch Distributed", VLDB, arXiv:2006.15704, Sec. 3.2): parameters are grouped into
  *buckets* of about ``bucket_cap_mb`` MiB in reverse registration order (the order backward
  produces their gradients); a per-parameter post-accumulate-grad hook counts the gradients
  that have arrived, and a full bucket is flattened and all-reduced *asynchronously* while
  backward goes on computing earlier layers. At the end of backward (an autograd engine
  callback) we wait for every bucket and write the averages back into ``.grad``. Buckets are
  launched strictly in bucket order, so every rank issues the same collectives in the same
  order (gloo and NCCL match calls by order, not by name). ``no_sync()`` turns the hooks off for
  gradient accumulation: K micro-steps, one all-reduce.

What we leave out (torch's DDP has it): a smaller first bucket (torch uses 1 MiB when
``bucket_cap_mb`` is not given), rebuilding buckets in the order gradients really arrived
after the first step, unused parameters (``find_unused_parameters``), gradients as views into
the bucket (``gradient_as_bucket_view``), several dtypes or devices in one model, comm hooks.
"""

from __future__ import annotations

from course_lib.parallel.ddp.data_parallel import (
    DataParallel,
    allreduce_gradients,
    assign_buckets,
    broadcast_parameters,
)

__all__ = [
    "DataParallel",
    "allreduce_gradients",
    "broadcast_parameters",
    "assign_buckets",
]
