"""One training step, and the same step split into micro-batches (gradient accumulation).

Introduced in notebooks/02_batch_size_and_accumulation.ipynb. Data parallelism's ``no_sync``
(unit 09), pipeline micro-batches (unit 12) and ZeRO (unit 10) reuse these pieces: a batch split
into equal micro-batches, each loss divided by their number, gradients summed by backward.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from course_lib import validate

#: a loss: (model output, targets) -> a scalar tensor
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

__all__ = ["training_step", "split_batch", "accumulation_step", "effective_batch"]


def training_step(
    model: nn.Module, optimizer: Any, loss_fn: LossFn, inputs: torch.Tensor, targets: torch.Tensor
) -> torch.Tensor:
    """Forward, backward, step, zero_grad: the unit every measurement in this unit times."""
    _check_optimizer(optimizer)
    loss = loss_fn(model(inputs), targets)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()


def _check_optimizer(optimizer: Any) -> None:
    if not (
        callable(getattr(optimizer, "step", None))
        and callable(getattr(optimizer, "zero_grad", None))
    ):
        raise TypeError(
            f"optimizer = {validate.describe(optimizer)}: expected an optimizer (a "
            "torch.optim.Optimizer, or anything with step() and zero_grad())"
        )


def split_batch(
    inputs: torch.Tensor, targets: torch.Tensor, micro_batches: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Split a batch into `micro_batches` equal micro-batches (views, no copies)."""
    micro_batches = validate.count("micro_batches", micro_batches, minimum=1)
    batch = inputs.shape[0]
    if batch % micro_batches:
        divisors = [d for d in range(1, batch + 1) if batch % d == 0]
        raise ValueError(
            f"micro_batches = {micro_batches}: expected a divisor of the batch of {batch} samples "
            f"(equal micro-batches keep the mean loss exact): {', '.join(map(str, divisors))}"
        )
    return list(zip(inputs.chunk(micro_batches), targets.chunk(micro_batches)))


def accumulation_step(
    model: nn.Module,
    optimizer: Any,
    loss_fn: LossFn,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    micro_batches: int,
) -> None:
    """One optimizer step on (inputs, targets), computed as `micro_batches` forward/backwards.

    The loss is a mean over samples, so each micro-batch loss is divided by the number of
    micro-batches: the summed gradients are then the gradient of the mean over the whole batch.
    """
    _check_optimizer(optimizer)
    optimizer.zero_grad(set_to_none=True)  # once, before the loop: backward() adds into .grad
    for x, y in split_batch(inputs, targets, micro_batches):
        loss = loss_fn(model(x), y) / micro_batches
        loss.backward()
    optimizer.step()  # once, after the loop


def effective_batch(micro_batch: int, accumulation_steps: int, world_size: int = 1) -> int:
    """Samples behind one optimizer step: micro-batch x accumulation steps x data-parallel ranks."""
    return (
        validate.count("micro_batch", micro_batch, minimum=1)
        * validate.count("accumulation_steps", accumulation_steps, minimum=1)
        * validate.count("world_size", world_size, minimum=1)
    )
