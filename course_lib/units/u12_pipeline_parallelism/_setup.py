"""Unit 12's shared setup: the model split, its batches and loss, the schedule configs, the reference."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from course_lib import validate
from course_lib.parallel import harness as H
from course_lib.parallel import pipeline as P

#: our schedule -> torch.distributed.pipelining's class of the same name
TORCH_SCHEDULES = {
    "gpipe": "ScheduleGPipe",
    "1f1b": "Schedule1F1B",
    "interleaved": "ScheduleInterleaved1F1B",
}


class Setup(dict[str, Any]):
    """The model and batch of a run: n_layers, width, seq, rows (batch rows), dtype."""

    def __init__(
        self,
        *,
        n_layers: int = 8,
        width: int = 32,
        seq: int = 16,
        rows: int = 8,
        dtype: torch.dtype = torch.float64,
    ) -> None:
        super().__init__(
            n_layers=validate.count("n_layers", n_layers, minimum=1),
            width=validate.count("width", width, minimum=4),
            seq=validate.count("seq", seq, minimum=1),
            rows=validate.count("rows", rows, minimum=1),
            dtype=dtype,
        )

    def model(self, seed: int = 0) -> torch.nn.Sequential:
        return P.make_stack(
            self["n_layers"], width=self["width"], seq=self["seq"], seed=seed, dtype=self["dtype"]
        )


def batch_fn(step: int, setup: Setup) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs (rows, seq, width) and targets of the same shape for step ``step``: a regression
    of the stack's output onto random targets (the loss is an MSE, a mean over the batch)."""
    g = torch.Generator().manual_seed(1000 + step)
    shape = (setup["rows"], setup["seq"], setup["width"])
    return (
        torch.randn(shape, generator=g, dtype=setup["dtype"]),
        torch.randn(shape, generator=g, dtype=setup["dtype"]),
    )


def _loss(model: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return F.mse_loss(model(batch[0]), batch[1])


def reference(setup: Setup, steps: int = 1) -> H.Record:
    """``steps`` SGD steps of the whole stack on one process, on the full batch (one intra-op
    thread: on a loaded 2-core machine two threads wait on each other, 30 times slower here)."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return H.reference_run(
            setup.model, lambda s: batch_fn(s, setup), steps=steps, loss_fn=_loss
        )
    finally:
        torch.set_num_threads(saved)


def _config(
    schedule: str, ranks: int, microbatches: int, virtual: int, setup: Setup
) -> list[range]:
    return P.check_pipeline(
        schedule,
        n_layers=setup["n_layers"],
        ranks=ranks,
        microbatches=microbatches,
        batch_rows=setup["rows"],
        virtual=virtual,
    )
