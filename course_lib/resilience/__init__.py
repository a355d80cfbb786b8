"""Failures and checkpoints: save a sharded run, lose a rank, load on any number of ranks.

Introduced in notebooks/18_failures_and_checkpoints.ipynb.

    from course_lib import resilience
    state = resilience.TrainState(model, opt, scheduler=sched, data=batches)
    resilience.save(state, root / f"step_{state.step:06d}")     # every rank, its own shards
    resilience.load(state, resilience.latest(root))              # on 4, 2 or 1 ranks

- ``checkpoint.py``: :func:`save` (blocking, or ``async_=True``), :func:`load`, :func:`verify`,
  :func:`latest`, :func:`checkpoint_bytes`, :class:`CheckpointError`: PyTorch's distributed
  checkpoint (DCP) with write-then-rename and checks before any byte is read;
  :class:`CheckpointIOError` (``failures.py``): a save or load that failed, each failed rank
  and its cause (``rank 1: No space left on device (ENOSPC) writing ...``) in its first lines;
- ``state.py``: :class:`TrainState` (model, optimizer, step, LR scheduler, every RNG, data
  position), :func:`rng_state`.
"""

from __future__ import annotations

from course_lib.resilience.checkpoint import (
    CheckpointError,
    CheckpointIOError,
    PendingSave,
    checkpoint_bytes,
    latest,
    load,
    save,
    verify,
)
from course_lib.resilience.state import PARTS, TrainState, rng_state, set_rng_state

__all__ = [
    "PARTS",
    "CheckpointError",
    "CheckpointIOError",
    "PendingSave",
    "TrainState",
    "checkpoint_bytes",
    "latest",
    "load",
    "rng_state",
    "save",
    "set_rng_state",
    "verify",
]
