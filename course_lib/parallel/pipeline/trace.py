"""Pipeline timelines: what ``run_schedule`` records of a step (:class:`StepTracer`), and two
ways of reading it: the bubble of a measured timeline and the replay of the same actions on
ideal hardware. Introduced in notebooks/12_pipeline_parallelism.ipynb."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

from course_lib.measure.timing import EventLog

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["StepTracer", "bubble_from_events", "replay"]


class StepTracer:
    """Records one rank's step on ``log`` (an EventLog on the shared clock), or nothing when
    ``log`` is None: each F/B as a span on lane "compute" (meta stage, mb, kind), each wait for
    a message as a span on lane "wait"."""

    def __init__(self, log: EventLog | None) -> None:
        self.log = log

    def now(self) -> int:
        return self.log.now_ns() if self.log is not None else 0

    def compute(self, kind: Literal["F", "B"], mb: int, stage: int, start: int) -> None:
        if self.log is not None:
            self.log.add(
                f"{kind}{mb}",
                start,
                self.log.now_ns(),
                lane="compute",
                stage=stage,
                mb=mb,
                kind=kind,
            )

    def wait(self, kind: Literal["F", "B"], mb: int, stage: int, start: int) -> None:
        if self.log is not None:
            self.log.add(
                f"wait {kind}{mb}", start, self.log.now_ns(), lane="wait", stage=stage, mb=mb
            )


def bubble_from_events(events: pd.DataFrame) -> dict[int, float]:
    """Idle fraction of each rank over the step: 1 - (its F/B time) / (first start to last
    end, over all ranks). ``events``: a DataFrame with rank, lane, start, end (``merge_event_logs``)."""
    compute = events[events["lane"] == "compute"]
    span = compute["end"].max() - compute["start"].min()
    busy = (compute["end"] - compute["start"]).groupby(compute["rank"]).sum()
    return {int(r): float(1 - b / span) for r, b in busy.items()}


def _dependency(kind: str, mb: int, k: int, n: int) -> tuple[str, int, int] | None:
    """What action ``kind`` on micro-batch ``mb`` of stage ``k`` (of ``n``) waits for."""
    if kind == "F":
        return ("F", k - 1, mb) if k > 0 else None
    return ("B", k + 1, mb) if k < n - 1 else ("F", k, mb)


def replay(
    orders: Sequence[Sequence[Any]], split: Sequence[range], *, backward_cost: float = 2.0
) -> list[dict[str, Any]]:
    """The same actions on ideal hardware: each F costs its stage's layer count, each B
    ``backward_cost`` times that, messages are free, and an action starts when its rank is free
    and its input has arrived. ``orders[r]`` is rank r's list of actions (e.g. the order a run
    recorded). Returns spans {rank, stage, mb, kind, start, end} in cost units; raises if the
    orders deadlock."""
    n, p = len(split), len(orders)
    done: dict[tuple[str, int, int], float] = {}
    pos, free, spans = [0] * p, [0.0] * p, []
    while any(pos[r] < len(orders[r]) for r in range(p)):
        moved = False
        for r in range(p):
            while pos[r] < len(orders[r]):
                kind, mb, k = orders[r][pos[r]]
                dep = _dependency(kind, mb, k, n)
                if dep is not None and dep not in done:
                    break
                start = max(free[r], done[dep] if dep else 0.0)
                cost = len(split[k]) * (1.0 if kind == "F" else backward_cost)
                free[r] = done[(kind, k, mb)] = start + cost
                spans.append(dict(rank=r, stage=k, mb=mb, kind=kind, start=start, end=start + cost))
                pos[r] += 1
                moved = True
        if not moved:
            raise RuntimeError(
                "these orders deadlock: every rank waits for a message that no "
                f"rank will send (positions {pos})"
            )
    return spans
