"""Parity harness: does a parallel training step compute what one process computes? (Units
09-12 and their tests.) Each scheme claims to train *the same
model* as one process on the full batch, only split over ranks. The harness checks the claim step
by step: K steps on one process (:func:`reference_run`), the same K steps under the wrapper in
every rank (:func:`parallel_run`), then the loss, every gradient and every updated parameter side
by side (:func:`compare`, :func:`assert_parity`)::

    def model_fn(seed):                 # must build the same model in every process
        torch.manual_seed(seed)
        return MLP(MLPConfig(in_features=8, hidden=(16,), out_features=1))

    def batch_fn(step):                 # the full batch of step `step`, the same everywhere
        return regression_task(32, 8, seed=step)

    def rank_fn(rank, world_size):
        model = MyDDP(model_fn(0))      # the wrapper under test
        return parallel_run(model, batch_fn, steps=3, shard=(rank, world_size))

    records = course_lib.launch(rank_fn, 4)             # one Record per rank
    assert_parity(reference_run(model_fn, batch_fn, steps=3), records)

What a unit plugs into :func:`parallel_run`:

* ``shard=(i, n)``: train on the i-th of n equal row slices of the batch (data parallel:
  ``(mesh.dp_rank, mesh.dp)``); tensor and pipeline ranks keep ``(0, 1)``, the full batch.
* ``step_fn(model, batch)``: forward, backward and whatever the wrapper does before the optimizer
  step (a manual all-reduce, a pipeline schedule); returns the loss, a mean over this rank's
  batch, or ``None`` where the rank has none (pipeline stages before the last). Default:
  ``loss_fn(model, batch).backward()``. On return every gradient to apply must be in place.
* ``gather_fn(model, which)``, ``which`` "param" or "grad": ``{name in the plain model: full
  tensor}``. The default, :func:`full_tensors`, fits replicated models (DDP) and torch's DTensor
  wrappers (``fully_shard``, ``parallelize_module``); from-scratch sharding brings its own
  (pipeline stages: :func:`merge_across`).

A step's loss is the mean of the losses all ranks return (equal shards: the full-batch mean).
Tolerances, and why Adam is checked in float64: ``compare.py`` (:func:`compare`).
"""

from __future__ import annotations

from course_lib.parallel.harness.compare import ATOL, RTOL, Record, assert_parity, compare
from course_lib.parallel.harness.parity import (
    Batch,
    StepFn,
    Stepper,
    Which,
    cross_entropy_loss,
    full_tensors,
    make_optimizer_fn,
    merge_across,
    mse_loss,
    parallel_run,
    reference_run,
    shard_batch,
)

__all__ = [
    "Record",
    "reference_run",
    "parallel_run",
    "compare",
    "assert_parity",
    "make_optimizer_fn",
    "mse_loss",
    "cross_entropy_loss",
    "shard_batch",
    "full_tensors",
    "merge_across",
    "RTOL",
    "ATOL",
    "Batch",
    "StepFn",
    "Stepper",
    "Which",
]
