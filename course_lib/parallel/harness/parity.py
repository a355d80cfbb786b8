"""Parity runs: the same training steps on one process and on ranks, the losses kept and
the tensors gathered for comparison."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from course_lib import validate
from course_lib.parallel.harness.compare import Record
from course_lib.runtime.groups import Group, group_info
from course_lib.techniques.optim import make_optimizer

__all__ = [
    "reference_run",
    "parallel_run",
    "make_optimizer_fn",
    "mse_loss",
    "cross_entropy_loss",
    "shard_batch",
    "full_tensors",
    "merge_across",
]

Which = Literal["param", "grad"]
Batch = Any  #: a tensor, or a tuple/list of tensors with the same number of rows


class Stepper(Protocol):
    """What ``optimizer_fn(model)`` returns: an optimizer, or a wrapper that is its own (ZeRO)."""

    def zero_grad(self, set_to_none: bool = ...) -> None: ...

    def step(self) -> Any: ...


ModelFn = Callable[[int], nn.Module]
BatchFn = Callable[[int], Batch]
LossFn = Callable[[nn.Module, Batch], torch.Tensor]
StepFn = Callable[[nn.Module, Batch], "torch.Tensor | None"]
GatherFn = Callable[[nn.Module, Which], dict[str, torch.Tensor]]
OptimizerFn = Callable[[nn.Module], Stepper]


# ---- building blocks users pass in ---------------------------------------------------------
def make_optimizer_fn(name: str = "sgd", *, lr: float = 0.1, **kwargs: Any) -> OptimizerFn:
    """``model -> optimizer`` over ``model.parameters()``, from ``techniques.optim.make_optimizer``
    (``make_optimizer_fn("adamw", lr=1e-2)``; the runs' default is SGD with lr 0.1). A wrapper
    with an optimizer of its own (ZeRO) passes its own function instead."""
    make_optimizer(name, [torch.zeros(1, requires_grad=True)], lr=lr, **kwargs)  # check now
    return functools.partial(_build_optimizer, name, lr, kwargs)


def _build_optimizer(name: str, lr: float, kwargs: dict[str, Any], model: nn.Module) -> Stepper:
    optimizer: Stepper = make_optimizer(name, model.parameters(), lr=lr, **kwargs)
    return optimizer


def mse_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    """Mean squared error of ``model(x)`` against ``y`` for ``batch = (x, y)`` (a regression
    task for the MLP)."""
    x, y = batch
    return F.mse_loss(model(x), y)


def cross_entropy_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    """Mean cross-entropy of ``model(x)`` against integer targets ``y``; logits of shape
    (..., classes) and targets (...) are flattened first, so it serves a GPT's (B, T, V) too."""
    x, y = batch
    logits = model(x)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def shard_batch(
    batch: Batch, index: int, count: int, *, device: torch.device | str | None = None
) -> Batch:
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


def full_tensors(model: nn.Module, which: Which = "param") -> dict[str, torch.Tensor]:
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


def merge_across(tensors: dict[str, torch.Tensor], group: Group = None) -> dict[str, torch.Tensor]:
    """The union of every rank's ``{name: tensor}`` over ``group`` (a collective), for tensors
    that each live on one rank only (pipeline stages). Where several ranks hold a name, the
    lowest rank's copy is kept, so merge over groups with one owner per name."""
    gathered: list[dict[str, torch.Tensor]] = [{} for _ in range(group_info(group).world_size)]
    dist.all_gather_object(gathered, tensors, group=group)
    merged: dict[str, torch.Tensor] = {}
    for part in gathered:
        for name, t in part.items():
            merged.setdefault(name, t)
    return merged


# ---- the runs ----------------------------------------------------------------------------
def reference_run(
    model_fn: ModelFn,
    batch_fn: BatchFn,
    *,
    steps: int = 1,
    optimizer_fn: OptimizerFn | None = None,
    loss_fn: LossFn = mse_loss,
    seed: int = 0,
) -> Record:
    """``steps`` steps of ``model_fn(seed)`` on one process, each on the full batch
    ``batch_fn(step)``, with ``optimizer_fn(model)`` (default: SGD, lr 0.1) and
    ``loss_fn(model, batch)`` (forward and loss, a mean over the batch; default
    :func:`mse_loss`)."""
    _check_callable("model_fn", model_fn)
    run = _Run.checked(batch_fn, steps, optimizer_fn, None, loss_fn, full_tensors)
    return run.execute(model_fn(seed), (0, 1), distributed=False)


def parallel_run(
    model: nn.Module,
    batch_fn: BatchFn,
    *,
    steps: int = 1,
    optimizer_fn: OptimizerFn | None = None,
    loss_fn: LossFn = mse_loss,
    step_fn: StepFn | None = None,
    gather_fn: GatherFn = full_tensors,
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
    run = _Run.checked(batch_fn, steps, optimizer_fn, step_fn, loss_fn, gather_fn)
    return run.execute(model, shard, distributed=dist.is_available() and dist.is_initialized())


@dataclass(frozen=True)
class _Run:
    """One run's settings, checked: K steps of batches, optimizer, step and gather."""

    batch_fn: BatchFn
    steps: int
    optimizer_fn: OptimizerFn
    step_fn: StepFn
    gather_fn: GatherFn

    @classmethod
    def checked(
        cls,
        batch_fn: BatchFn,
        steps: int,
        optimizer_fn: OptimizerFn | None,
        step_fn: StepFn | None,
        loss_fn: LossFn,
        gather_fn: GatherFn,
    ) -> _Run:
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
        return cls(batch_fn, steps, optimizer_fn, step_fn, gather_fn)

    def execute(self, model: nn.Module, shard: tuple[int, int], *, distributed: bool) -> Record:
        optimizer = self.optimizer_fn(model)
        device = next((p.device for p in model.parameters()), torch.device("cpu"))
        record = Record(params=[self.gather_fn(model, "param")])
        for step in range(self.steps):
            batch = shard_batch(self.batch_fn(step), *shard, device=device)
            optimizer.zero_grad(set_to_none=True)
            loss = self.step_fn(model, batch)
            record.losses.append(_global_loss(loss) if distributed else _own_loss(loss))
            record.grads.append(self.gather_fn(model, "grad"))
            optimizer.step()
            record.params.append(self.gather_fn(model, "param"))
        return record


def _default_step(loss_fn: LossFn, model: nn.Module, batch: Batch) -> torch.Tensor:
    loss = loss_fn(model, batch)
    loss.backward()
    return loss


def _own_loss(loss: torch.Tensor | None) -> float:
    if loss is None:
        raise RuntimeError("step_fn returned no loss: a run on one process must return it")
    return float(loss.detach())


def _global_loss(loss: torch.Tensor | None) -> float:
    """Mean over all ranks of the losses they return (``None`` where a rank has none)."""
    mine = None if loss is None else float(loss.detach())
    every: list[float | None] = [None] * group_info().world_size
    dist.all_gather_object(every, mine)
    values = [v for v in every if v is not None]
    if not values:
        raise RuntimeError(
            "no rank returned a loss from step_fn: the rank that computes the loss must return it"
        )
    return math.fsum(values) / len(values)


def _check_callable(name: str, value: Any) -> None:
    if not callable(value):
        raise TypeError(f"{name} = {validate.describe(value)}: expected a callable")
