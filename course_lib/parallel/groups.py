"""Who am I in a process group (:mod:`course_lib.runtime.groups`, re-exported here for the
parallel mechanisms that ask it): ``group_info(group)`` -> ``GroupInfo(rank, world_size, group,
root)``.
"""

from __future__ import annotations

from course_lib.runtime.groups import Group, GroupInfo, global_rank, group_info

__all__ = ["Group", "GroupInfo", "group_info", "global_rank"]
