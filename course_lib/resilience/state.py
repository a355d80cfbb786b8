"""What a run must save to continue exactly where it stopped: :class:`TrainState`.

Introduced in notebooks/18_failures_and_checkpoints.ipynb. The weights are not enough: Adam's two
moments (or the next steps differ), the step (or the run trains past its end and names its
checkpoints wrong), the learning-rate schedule (or the warm-up starts again), every random
generator (dropout masks, sampling) and the data loader's position (or batches are seen twice and
others never). :class:`TrainState` gathers them into one ``state_dict`` for
:func:`course_lib.resilience.save`; ``load_state_dict`` puts each back.

Model and optimizer go through ``torch.distributed.checkpoint.state_dict`` (parameter names as
keys, DTensor shards kept sharded), so a checkpoint written by 4 ranks loads on 2 or 1. The random
generators are saved once: the course's runs keep every generator the same on every rank (each
rank draws the numbers of the whole global batch and uses its own part), which is also what makes
a run on 4 ranks continue bit for bit on 2.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from typing import Any, TypedDict

import numpy as np
import torch
from torch.distributed.checkpoint.state_dict import (
    get_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from course_lib import validate

__all__ = ["PARTS", "TrainState", "rng_state", "set_rng_state"]

#: what a :class:`TrainState` saves, each a key of its state_dict
PARTS = ("model", "optim", "step", "scheduler", "rng", "data")


class RngState(TypedDict):
    """The state of every random generator of a process (what :func:`rng_state` returns)."""

    torch: torch.Tensor
    python: tuple[Any, ...]
    numpy: Any


def rng_state() -> RngState:
    """Every random generator of this process: torch's default one, Python's and NumPy's."""
    return {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": np.random.get_state(),
    }


def set_rng_state(state: RngState) -> None:
    """Put back what :func:`rng_state` returned."""
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])


class TrainState:
    """Model, optimizer, step, LR scheduler, RNGs and data position of one run.

    ``data`` is any object with ``state_dict()``/``load_state_dict()`` (the unit's batch stream
    keeps its epoch and position). ``parts`` chooses what is saved and restored (default
    :data:`PARTS`: everything); leaving one out is how the lecture shows what each is for."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        scheduler: Any = None,
        data: Any = None,
        step: int = 0,
        parts: Iterable[str] = PARTS,
    ) -> None:
        self.model, self.optimizer, self.scheduler, self.data = model, optimizer, scheduler, data
        self.step = validate.count("step", step)
        self.parts = tuple(validate.choices("parts", list(parts), PARTS))
        for name, obj in (("scheduler", scheduler), ("data", data)):
            if name in self.parts and obj is None:
                self.parts = tuple(p for p in self.parts if p != name)

    def state_dict(self) -> dict[str, Any]:
        """One nested dict of everything in ``parts`` (tensors kept as they are, DTensors sharded)."""
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        everything = {
            "model": model_sd,
            "optim": optim_sd,
            "step": self.step,
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "rng": rng_state(),
            "data": self.data.state_dict() if self.data is not None else None,
        }
        return {k: everything[k] for k in self.parts}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        """Restore every part in ``parts`` from ``sd`` (what :meth:`state_dict` gave, filled by
        a load); a part left out keeps its current value."""
        missing = [p for p in self.parts if p not in sd]
        if missing:
            raise KeyError(f"sd: expected the parts {list(self.parts)}, missing {missing}")
        if "model" in sd:
            set_model_state_dict(self.model, sd["model"])
        if "optim" in sd:
            set_optimizer_state_dict(self.model, self.optimizer, sd["optim"])
        if "step" in sd:
            self.step = int(sd["step"])
        if "scheduler" in sd and self.scheduler is not None:
            self.scheduler.load_state_dict(sd["scheduler"])
        if "rng" in sd:
            set_rng_state(sd["rng"])
        if "data" in sd and self.data is not None:
            self.data.load_state_dict(sd["data"])
