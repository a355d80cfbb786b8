"""What one pipeline rank holds and does (re-exported by :mod:`course_lib.parallel.pipeline`,
the story of the schedules): an :class:`Action` is one forward or backward of one micro-batch on
one stage, :func:`stage_owner` places the stages on the ranks, and a :class:`PipelineRank` is
the stages one rank holds, cut from the full model. :func:`~course_lib.parallel.pipeline.executor.run_schedule`
runs a list of actions on a PipelineRank.
Introduced in notebooks/12_pipeline_parallelism.ipynb.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
from torch import nn

from course_lib import validate

__all__ = ["Action", "PipelineRank", "stage_owner"]


class Action(NamedTuple):
    """One thing a rank does: ``kind`` "F" or "B", on ``microbatch``, for (global) ``stage``."""

    kind: str
    microbatch: int
    stage: int


def stage_owner(stage: int, ranks: int) -> int:
    """The rank that holds ``stage``: round robin, stage k on rank k mod p (with v = 1 stage
    per rank that is rank k itself)."""
    return stage % ranks


class PipelineRank(nn.Module):
    """The stages one rank holds, cut from the full model ``layers`` by ``split`` (one range
    of layers per stage): stages rank, rank+p, ... (round robin). ``stages[str(k)]`` is stage
    k; :meth:`tensors` names parameters as in ``layers`` ("3.attn.c_attn.weight").
    ``owner(stage, ranks) -> rank`` places the stages and routes the messages (default
    :func:`stage_owner`)."""

    def __init__(
        self,
        layers: nn.Sequential,
        split: Sequence[range],
        rank: int,
        ranks: int,
        *,
        owner: Callable[[int, int], int] = stage_owner,
    ):
        super().__init__()
        self.split, self.rank, self.ranks, self.owner = list(split), rank, ranks, owner
        self.stage_ids = [k for k in range(len(split)) if owner(k, ranks) == rank]
        self.max_in_flight: dict[int, int] = {}  # stage -> most micro-batches held (run_schedule)
        self.stages = nn.ModuleDict(
            {str(k): nn.Sequential(*[layers[i] for i in split[k]]) for k in self.stage_ids}
        )

    def tensors(self, which: str = "param") -> dict[str, torch.Tensor]:
        """This rank's parameters or gradients named as in the full model (CPU copies)."""
        which = validate.choice("which", which, ("param", "grad"))
        out = {}
        for k in self.stage_ids:
            for name, p in self.stages[str(k)].named_parameters():
                t = p if which == "param" else p.grad
                if t is not None:
                    j, rest = name.split(".", 1)
                    out[f"{self.split[k].start + int(j)}.{rest}"] = t.detach().to("cpu", copy=True)
        return out
