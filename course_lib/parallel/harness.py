"""Parity harness: does a parallel training step compute what one process computes?

Used in notebooks/09_data_parallelism.ipynb, 10 (ZeRO/FSDP), 11 (tensor parallelism) and 12
(pipeline parallelism), and in their tests. Each of those schemes claims to train *the same
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

A step's global-batch loss is the mean of the losses all ranks return: with equal shards the
mean of shard means is the full-batch mean, and copies (TP ranks, DP replicas) leave it unchanged.

Tolerance. The parallel run adds the same numbers in another order (per-shard sums then an
all-reduce, split matmuls). float32 addition is not associative: a sum of n terms is off by up
to about (n-1)·eps·Σ|x_i| (Higham, "Accuracy and Stability of Numerical Algorithms", 2nd ed.,
§4.2), eps = 2^-23 ≈ 1.2e-7, relative differences around 1e-6 for the course's models. A tensor
(or a loss) passes when

    max |parallel - reference| <= atol + rtol · max |reference|        (rtol 1e-5, atol 1e-6)

a scale per tensor, not per element: an element that is a near-cancelling sum has a large
relative error and no meaning of its own. In tests/parallel/test_harness.py correct wrappers stay
below 2% of the tolerance; the planted bugs (summed instead of averaged gradients, a rank that
keeps its local gradient) exceed it 4·10^4 to 2·10^5 times at their first wrong gradient.
Override ``rtol``/``atol`` for lower precisions (bfloat16 needs about 1e-2).

Adam in float32. Adam's step for one element is about lr·g/(|g| + eps_adam), with slope
lr/eps_adam at g = 0 (1e6 for lr 1e-2, eps_adam 1e-8): the rounding noise of a nearly-zero
gradient becomes a visible step in a random direction. Attention has such gradients: the key
bias's is exactly zero in exact arithmetic (softmax ignores a shift shared by a row). Measured on
the tiny GPT under DDP on 4 ranks with AdamW lr 1e-2: parameters differ by up to 1e-4 after one
step (57 times the tolerance) while every gradient of that step matches; with SGD the same run
stays at 2%. So check Adam-based wrappers in float64 (``model_fn`` returns ``model.double()``,
float64 inputs): the noise is 2^29 times smaller and the same run stays at 1e-6 of the tolerance.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import pandas as pd
import torch
import torch.distributed as dist
import torch.nn.functional as F

from course_lib import validate
from course_lib.techniques.optim import make_optimizer

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
]

RTOL = 1e-5  #: default relative tolerance, times max |reference| of each tensor
ATOL = 1e-6  #: default absolute tolerance


@dataclass
class Record:
    """What one run did, in the names and shapes of the plain (unwrapped) model."""

    losses: list[float] = field(default_factory=list)
    """``losses[k]``: the global-batch loss of step k+1"""
    grads: list[dict[str, torch.Tensor]] = field(default_factory=list)
    """``grads[k]``: the gradients step k+1 applied, by parameter name"""
    params: list[dict[str, torch.Tensor]] = field(default_factory=list)
    """``params[0]``: before training; ``params[k]``: after step k"""


# ---- building blocks users pass in ---------------------------------------------------------
def make_optimizer_fn(name: str = "sgd", *, lr: float = 0.1, **kwargs) -> Callable:
    """``model -> optimizer`` over ``model.parameters()``, from ``techniques.optim.make_optimizer``
    (``make_optimizer_fn("adamw", lr=1e-2)``; the runs' default is SGD with lr 0.1). A wrapper
    with an optimizer of its own (ZeRO) passes its own function instead."""
    make_optimizer(name, [torch.zeros(1, requires_grad=True)], lr=lr, **kwargs)  # check now
    return functools.partial(_build_optimizer, name, lr, kwargs)


def _build_optimizer(name, lr, kwargs, model):
    return make_optimizer(name, model.parameters(), lr=lr, **kwargs)


def mse_loss(model: torch.nn.Module, batch) -> torch.Tensor:
    """Mean squared error of ``model(x)`` against ``y`` for ``batch = (x, y)`` (a regression
    task for the MLP)."""
    x, y = batch
    return F.mse_loss(model(x), y)


def cross_entropy_loss(model: torch.nn.Module, batch) -> torch.Tensor:
    """Mean cross-entropy of ``model(x)`` against integer targets ``y``; logits of shape
    (..., classes) and targets (...) are flattened first, so it serves a GPT's (B, T, V) too."""
    x, y = batch
    logits = model(x)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def shard_batch(batch, index: int, count: int, *, device=None):
    """The ``index``-th of ``count`` equal slices (along dim 0) of every tensor of ``batch`` (a
    tensor, or a tuple/list of tensors with the same number of rows), moved to ``device`` if
    given (the runs pass the model's device: a GPU under NCCL)."""
    count = validate.count("count", count, minimum=1)
    index = validate.count("index", index, minimum=0, maximum=count - 1)
    tensors = [batch] if isinstance(batch, torch.Tensor) else list(batch)
    for t in tensors:
        if not isinstance(t, torch.Tensor) or t.dim() == 0:
            raise TypeError(
                f"batch = {validate.describe(batch)}: expected a tensor or a "
                "tuple of tensors with a batch dimension"
            )
        if t.shape[0] % count:
            raise ValueError(
                f"batch rows = {t.shape[0]}: expected a multiple of the {count} "
                "shards (equal shards keep the mean of shard losses equal to "
                "the full-batch loss)"
            )
    out = [t.tensor_split(count)[index].to(device) for t in tensors]  # (rows / count, ...)
    return out[0] if isinstance(batch, torch.Tensor) else type(batch)(out)


def full_tensors(model: torch.nn.Module, which: str = "param") -> dict[str, torch.Tensor]:
    """This rank's parameters (``which="param"``) or gradients (``"grad"``) by name, as plain
    CPU tensors (copies). A leading ``module.`` (what DDP-style wrappers add) is dropped from the
    names, and a DTensor is gathered into its full tensor (a collective: every rank of its mesh
    must call this). Parameters without a gradient are left out of "grad"."""
    which = validate.choice("which", which, ("param", "grad"))
    out = {}
    for name, p in model.named_parameters():
        t = p if which == "param" else p.grad
        if t is None:
            continue
        if hasattr(t, "full_tensor"):  # a DTensor (sharded or replicated over a DeviceMesh)
            t = t.full_tensor()
        while name.startswith("module."):
            name = name[len("module.") :]
        out[name] = t.detach().to("cpu", copy=True)
    return out


def merge_across(tensors: dict[str, torch.Tensor], group=None) -> dict[str, torch.Tensor]:
    """The union of every rank's ``{name: tensor}`` over ``group`` (a collective), for tensors
    that each live on one rank only (pipeline stages). Where several ranks hold a name, the
    lowest rank's copy is kept, so merge over groups with one owner per name."""
    gathered = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, tensors, group=group)
    merged: dict[str, torch.Tensor] = {}
    for part in gathered:
        for name, t in part.items():
            merged.setdefault(name, t)
    return merged


# ---- the runs ----------------------------------------------------------------------------
def reference_run(
    model_fn: Callable,
    batch_fn: Callable,
    *,
    steps: int = 1,
    optimizer_fn: Callable | None = None,
    loss_fn: Callable = mse_loss,
    seed: int = 0,
) -> Record:
    """``steps`` steps of ``model_fn(seed)`` on one process, each on the full batch
    ``batch_fn(step)``, with ``optimizer_fn(model)`` (default: SGD, lr 0.1) and
    ``loss_fn(model, batch)`` (forward and loss, a mean over the batch; default
    :func:`mse_loss`)."""
    _check_callable("model_fn", model_fn)
    steps, optimizer_fn, step_fn = _check_run(
        steps, batch_fn, optimizer_fn, None, loss_fn, full_tensors
    )
    return _run(
        model_fn(seed),
        batch_fn,
        steps,
        optimizer_fn,
        step_fn,
        full_tensors,
        (0, 1),
        distributed=False,
    )


def parallel_run(
    model: torch.nn.Module,
    batch_fn: Callable,
    *,
    steps: int = 1,
    optimizer_fn: Callable | None = None,
    loss_fn: Callable = mse_loss,
    step_fn: Callable | None = None,
    gather_fn: Callable = full_tensors,
    shard: tuple[int, int] = (0, 1),
) -> Record:
    """K steps of the wrapped ``model`` in this rank; call it in every rank (it runs
    collectives). Same arguments as :func:`reference_run`, plus the three hooks of the module
    docstring: ``step_fn(model, batch)``, ``gather_fn(model, which)`` and ``shard=(i, n)``.
    Outside a process group it runs alone (``losses`` are then this process's own)."""
    if not (isinstance(shard, Sequence) and len(shard) == 2):
        raise TypeError(f"shard = {validate.describe(shard)}: expected (index, count)")
    count = validate.count("shard count", shard[1], minimum=1)
    shard = (validate.count("shard index", shard[0], minimum=0, maximum=count - 1), count)
    steps, optimizer_fn, step_fn = _check_run(
        steps, batch_fn, optimizer_fn, step_fn, loss_fn, gather_fn
    )
    return _run(
        model,
        batch_fn,
        steps,
        optimizer_fn,
        step_fn,
        gather_fn,
        shard,
        distributed=dist.is_available() and dist.is_initialized(),
    )


def _check_run(steps, batch_fn, optimizer_fn, step_fn, loss_fn, gather_fn):
    steps = validate.count("steps", steps, minimum=1)
    if optimizer_fn is None:
        optimizer_fn = make_optimizer_fn("sgd", lr=0.1)
    if step_fn is None:
        _check_callable("loss_fn", loss_fn)
        step_fn = functools.partial(_default_step, loss_fn)
    for name, fn in [
        ("batch_fn", batch_fn),
        ("optimizer_fn", optimizer_fn),
        ("step_fn", step_fn),
        ("gather_fn", gather_fn),
    ]:
        _check_callable(name, fn)
    return steps, optimizer_fn, step_fn


def _run(
    model, batch_fn, steps, optimizer_fn, step_fn, gather_fn, shard, *, distributed: bool
) -> Record:
    optimizer = optimizer_fn(model)
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    record = Record(params=[gather_fn(model, "param")])
    for step in range(steps):
        batch = shard_batch(batch_fn(step), *shard, device=device)
        optimizer.zero_grad(set_to_none=True)
        loss = step_fn(model, batch)
        record.losses.append(_global_loss(loss) if distributed else float(loss.detach()))
        record.grads.append(gather_fn(model, "grad"))
        optimizer.step()
        record.params.append(gather_fn(model, "param"))
    return record


def _default_step(loss_fn, model, batch):
    loss = loss_fn(model, batch)
    loss.backward()
    return loss


def _global_loss(loss) -> float:
    """Mean over all ranks of the losses they return (``None`` where a rank has none)."""
    mine = None if loss is None else float(loss.detach())
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    values = [v for v in every if v is not None]
    if not values:
        raise RuntimeError(
            "no rank returned a loss from step_fn: the rank that computes the loss must return it"
        )
    return math.fsum(values) / len(values)


def _check_callable(name: str, value) -> None:
    if not callable(value):
        raise TypeError(f"{name} = {validate.describe(value)}: expected a callable")


# ---- comparing -----------------------------------------------------------------------------
COLUMNS = ["rank", "step", "quantity", "name", "max_abs_diff", "tolerance", "ok", "problem"]


def compare(
    reference: Record,
    parallel: Record | Sequence[Record],
    *,
    rtol: float = RTOL,
    atol: float = ATOL,
) -> pd.DataFrame:
    """One row per step, rank and compared tensor (the columns of ``COLUMNS``), in the order
    things happen: parameters at step 0 (before training: did every process build the same
    model?), then for each step and rank the loss, the gradients and the updated parameters.
    ``parallel`` is one Record or the list ``launch`` returns (row ``rank`` = its index)."""
    rtol = validate.number("rtol", rtol, minimum=0)
    atol = validate.number("atol", atol, minimum=0)
    records = [parallel] if isinstance(parallel, Record) else list(parallel)
    for r in [reference, *records]:
        if not isinstance(r, Record):
            raise TypeError(f"record = {validate.describe(r)}: expected a harness.Record")
    rows, f64 = [], torch.float64
    for rank, rec in enumerate(records):
        if len(rec.losses) != len(reference.losses):
            rows.append(
                _row(
                    rank,
                    0,
                    "steps",
                    "",
                    math.inf,
                    0.0,
                    f"{len(rec.losses)} steps run, reference ran {len(reference.losses)}",
                )
            )
            continue
        rows += _tensor_rows(rank, 0, "param", reference.params[0], rec.params[0], rtol, atol)
        for k in range(len(reference.losses)):
            ref_loss, got_loss = reference.losses[k], rec.losses[k]
            rows.append(
                _check(
                    rank,
                    k + 1,
                    "loss",
                    "",
                    torch.tensor(ref_loss, dtype=f64),
                    torch.tensor(got_loss, dtype=f64),
                    rtol,
                    atol,
                )
            )
            rows += _tensor_rows(rank, k + 1, "grad", reference.grads[k], rec.grads[k], rtol, atol)
            rows += _tensor_rows(
                rank, k + 1, "param", reference.params[k + 1], rec.params[k + 1], rtol, atol
            )
    rows.sort(key=lambda row: row["step"])  # stable: ranks stay in order within a step
    return pd.DataFrame(rows, columns=COLUMNS)


def assert_parity(
    reference: Record,
    parallel: Record | Sequence[Record],
    *,
    rtol: float = RTOL,
    atol: float = ATOL,
) -> pd.DataFrame:
    """:func:`compare`, raising ``AssertionError`` at the first mismatch (rank, step, tensor,
    max abs diff, tolerance); returns the table when everything matches."""
    table = compare(reference, parallel, rtol=rtol, atol=atol)
    bad = table[~table["ok"]]
    if len(bad):
        first = bad.iloc[0]
        what = first.quantity + (f" {first['name']!r}" if first["name"] else "")
        raise AssertionError(
            f"parity fails at rank {first['rank']}, step {first.step}, {what}: "
            f"{first.problem}; {len(bad)} of {len(table)} comparisons fail"
        )
    return table


def _tensor_rows(rank, step, quantity, ref: dict, got: dict, rtol, atol) -> list[dict]:
    rows = [
        _check(rank, step, quantity, name, t, got.get(name), rtol, atol) for name, t in ref.items()
    ]
    rows += [
        _row(rank, step, quantity, name, math.inf, 0.0, "not in the reference run")
        for name in got
        if name not in ref
    ]
    return rows


def _check(rank, step, quantity, name, ref, got, rtol, atol) -> dict:
    if got is None:
        return _row(rank, step, quantity, name, math.inf, 0.0, "missing from the parallel run")
    if got.shape != ref.shape:
        return _row(
            rank,
            step,
            quantity,
            name,
            math.inf,
            0.0,
            f"shape {tuple(got.shape)} != reference {tuple(ref.shape)}",
        )
    ref64, got64 = ref.double(), got.double()
    diff = float((got64 - ref64).abs().max()) if ref.numel() else 0.0
    scale = float(ref64.abs().max()) if ref.numel() else 0.0
    tol = atol + rtol * scale
    problem = (
        ""
        if diff <= tol
        else (
            f"max abs diff {diff:.3g} > tolerance {tol:.3g} "
            f"(atol {atol:g} + rtol {rtol:g} × max|reference| {scale:.3g})"
        )
    )
    return _row(rank, step, quantity, name, diff, tol, problem)


def _row(rank, step, quantity, name, diff, tol, problem) -> dict:
    return dict(
        rank=rank,
        step=step,
        quantity=quantity,
        name=name,
        max_abs_diff=diff,
        tolerance=tol,
        ok=not problem,
        problem=problem,
    )
