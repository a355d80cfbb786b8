"""Unit 10's parity pieces shared by tasks 1 and 3: what the ranks of a run handed back, checked.
A rank's record crosses the grading wall as :mod:`course_lib.grading.records` writes and reads it,
and the first mismatch against one process on the full batch is
:func:`course_lib.grading.records.first_mismatch`."""

from __future__ import annotations

from typing import Any

from course_lib.grading.core import fail


def rank_results(task: int, data: Any, world_size: int) -> list[dict[str, Any]]:
    """``data["ranks"]``: one dict per rank, checked."""
    ranks = data.get("ranks") if isinstance(data, dict) else None
    if not (
        isinstance(ranks, list)
        and len(ranks) == world_size
        and all(isinstance(r, dict) for r in ranks)
    ):
        fail(task, f"the run handed back no results of its {world_size} ranks")
    return ranks
