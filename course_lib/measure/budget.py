"""A device-memory budget: "does this step fit?", answered before anything is allocated.

On a GPU the budget is the device's free memory; on a CPU there is no device memory to run out
of, so the budget is *simulated*: a number of bytes you choose, compared with a measured
(MemoryMeter) or estimated peak. Exceeding it raises :class:`SimulatedOOM`, an out-of-memory
error that names the bytes requested and available and says it was simulated.

Introduced in notebooks/02_batch_size_and_accumulation.ipynb (the largest batch that fits);
the memory-saving units (offload, checkpointing, LoRA, ZeRO) use it to show a step that does not
fit and then does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from course_lib import validate
from course_lib.measure import estimate

__all__ = ["SimulatedOOM", "MemoryBudget"]


class SimulatedOOM(MemoryError):
    """Raised by MemoryBudget.check when a run would need more bytes than the budget holds.

    On CPU there is no device memory to run out of, so the budget is simulated: the error is
    raised *before* anything is allocated, from a measured or estimated peak.
    """

    def __init__(self, requested: int, available: int, *, what: str, simulated: bool = True):
        self.requested = int(requested)
        self.available = int(available)
        self.what = what
        self.simulated = simulated
        kind = "simulated device budget" if simulated else "device"
        super().__init__(
            f"out of memory ({'simulated' if simulated else 'real'}): {what} needs "
            f"{estimate.fmt_bytes(self.requested)} ({self.requested:,} B) but the {kind} has "
            f"{estimate.fmt_bytes(self.available)} ({self.available:,} B) available; "
            f"short by {estimate.fmt_bytes(self.requested - self.available)}. "
            f"Reduce the batch size or use gradient accumulation."
        )


@dataclass(frozen=True)
class MemoryBudget:
    """A number of bytes a training step may use at its peak."""

    capacity_bytes: int
    """Bytes available to the run (for a simulated budget, any positive number you choose)."""
    simulated: bool = True
    """True on CPU: the budget is a number we compare against, not a device that can fail."""

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "capacity_bytes", validate.count("capacity_bytes", self.capacity_bytes, minimum=1)
        )

    @classmethod
    def for_device(cls, device: torch.device | str, *, simulated_bytes: int) -> MemoryBudget:
        """The real free memory of a CUDA device; on CPU a simulated budget of `simulated_bytes`."""
        device = torch.device(device)
        if device.type == "cuda":
            free, _total = torch.cuda.mem_get_info(device)
            return cls(int(free), simulated=False)
        return cls(int(simulated_bytes), simulated=True)

    def check(self, requested: int, *, what: str = "this step") -> None:
        """Raise SimulatedOOM if `requested` bytes do not fit in the budget."""
        if requested > self.capacity_bytes:
            raise SimulatedOOM(requested, self.capacity_bytes, what=what, simulated=self.simulated)

    def fits(self, requested: int) -> bool:
        return requested <= self.capacity_bytes

    def label(self) -> str:
        tag = "simulated budget" if self.simulated else "free device memory"
        return f"{estimate.fmt_bytes(self.capacity_bytes)} ({tag})"
