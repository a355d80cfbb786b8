"""Who am I in a process group: one helper, one named tuple.

``group_info(group)`` answers the three questions every parallel mechanism asks of its group:
this process's rank in it, its size, and the global rank of its rank 0 (``broadcast`` and
point-to-point calls address peers by global rank). ``group=None`` is the default group (all
ranks). Part of the runtime: measurement and the parallel mechanisms both ask it.
"""

from __future__ import annotations

from typing import NamedTuple

import torch.distributed as dist

__all__ = ["Group", "GroupInfo", "group_info", "global_rank"]

#: a process group; None stands for the default group (all ranks)
Group = dist.ProcessGroup | None


class GroupInfo(NamedTuple):
    """This process's place in ``group``: ``rank`` in ``0..world_size-1``; ``root`` is the
    global rank of the group's rank 0."""

    rank: int
    world_size: int
    group: Group
    root: int


def group_info(group: Group = None, *, needs: str = "this", single: bool = False) -> GroupInfo:
    """:class:`GroupInfo` of ``group``. Outside a process group: with ``single=True`` and no
    ``group``, one process alone (rank 0 of 1); otherwise a RuntimeError that says that
    ``needs`` (e.g. "data parallelism") needs a process group."""
    if not (dist.is_available() and dist.is_initialized()):
        if single and group is None:
            return GroupInfo(0, 1, None, 0)
        raise RuntimeError(
            f"{needs} needs a process group: run this inside "
            "course_lib.launch(fn, world_size) (or torchrun)"
        )
    return GroupInfo(dist.get_rank(group), dist.get_world_size(group), group, global_rank(group, 0))


def global_rank(group: Group, group_rank: int) -> int:
    """The global rank of ``group_rank`` in ``group`` (itself in the default group)."""
    return group_rank if group is None else dist.get_global_rank(group, group_rank)
