"""Timing that can be trusted: warm-up, synchronize, repeat, report the median and the spread;
and a per-rank event log on a clock that all ranks of one machine share.

    from course_lib.measure.timing import time_fn, EventLog, merge_event_logs
    r = time_fn(lambda: model(x), warmup=2, repeat=10)
    r.median_s, r.p10_s, r.p90_s

    log = EventLog(rank)                  # one per rank, inside the worker
    with log.span("fwd", mb=0):
        ...
    return log.to_records()               # plain data back through course_lib.launch
    df = merge_event_logs(results)        # columns rank, name, start, end, duration, meta

Why these choices (nanoGPT's bench.py does the same): the first calls pay for lazy
initialization, caches and allocator growth, so they are run and thrown away (``warmup``); CUDA
kernels run asynchronously, so without ``torch.cuda.synchronize()`` a timer measures the launch,
not the work; one run is noise on a shared machine, so we repeat and report the median (robust to
the odd slow run) and the 10th/90th percentiles. Absolute times on a shared 2-core machine are
noise: notebooks show them, graders never check them.

Clocks: ``time.perf_counter_ns`` is only guaranteed to be comparable inside one process. The
event log uses ``time.monotonic_ns`` -- on Linux ``CLOCK_MONOTONIC``, one clock for every process
on the host (it never jumps with NTP), so spans of different ranks line up. Across hosts use
``clock="wall"`` (``time.time_ns``, synchronized by NTP to about a millisecond, may jump).
Introduced in notebooks/02_batch_size_and_accumulation.ipynb; the event log draws the per-rank
timeline of notebooks/13_interconnects_and_backends.ipynb (and of unit 12, pipeline parallelism).
"""

from __future__ import annotations

import statistics
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "TimingResult",
    "time_fn",
    "time_collective",
    "EventLog",
    "merge_event_logs",
    "CLOCKS",
]


def _quantile(sorted_times: list[float], q: float) -> float:
    # linear interpolation between closest ranks (numpy's default "linear" method)
    if len(sorted_times) == 1:
        return sorted_times[0]
    pos = q * (len(sorted_times) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_times) - 1)
    return sorted_times[lo] + (sorted_times[hi] - sorted_times[lo]) * (pos - lo)


@dataclass(frozen=True)
class TimingResult:
    """Seconds per call of a timed function (``times`` holds every repeat, in call order)."""

    median_s: float
    p10_s: float
    p90_s: float
    min_s: float
    max_s: float
    mean_s: float
    n: int
    times: tuple[float, ...] = field(repr=False)

    @classmethod
    def from_times(cls, times: Iterable[float]) -> "TimingResult":
        times = tuple(float(t) for t in times)
        if not times:
            raise ValueError("times is empty; need at least one measurement")
        s = sorted(times)
        return cls(
            median_s=statistics.median(s),
            p10_s=_quantile(s, 0.1),
            p90_s=_quantile(s, 0.9),
            min_s=s[0],
            max_s=s[-1],
            mean_s=statistics.fmean(s),
            n=len(s),
            times=times,
        )

    def __str__(self) -> str:
        return (
            f"{self.median_s * 1e3:.3f} ms median (p10 {self.p10_s * 1e3:.3f}, "
            f"p90 {self.p90_s * 1e3:.3f}, n={self.n})"
        )


def time_fn(
    fn: Callable[[], Any],
    *,
    warmup: int = 2,
    repeat: int = 10,
    sync: bool | Callable[[], None] | None = None,
) -> TimingResult:
    """Call ``fn()`` ``warmup`` times untimed, then ``repeat`` times timed (perf_counter).

    ``sync``: None (default) synchronizes CUDA before and after each timed call when CUDA is
    initialized in this process; True always does (an error without CUDA is avoided: it is a
    no-op then); False never; or a callable to run instead (e.g. ``torch.xpu.synchronize``).
    """
    from course_lib import validate

    if not callable(fn):
        raise TypeError(
            f"fn = {validate.describe(fn)}: expected a callable (got {type(fn).__name__})"
        )
    warmup = validate.count("warmup", warmup, minimum=0)
    repeat = validate.count("repeat", repeat, minimum=1)
    sync_fn: Callable[[], None] | None
    if sync is None or sync is True:
        from course_lib.runtime.device import sync as device_sync

        sync_fn = device_sync
    elif sync is False:
        sync_fn = None
    elif callable(sync):
        sync_fn = sync
    else:
        raise TypeError(f"sync = {sync!r}: expected None, True, False or a callable")
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        if sync_fn:
            sync_fn()
        t0 = time.perf_counter()
        fn()
        if sync_fn:
            sync_fn()
        times.append(time.perf_counter() - t0)
    return TimingResult.from_times(times)


#: clocks an EventLog can use (name -> function returning integer nanoseconds)
def time_collective(
    op: Callable[[], Any],
    *,
    warmup: int = 1,
    repeat: int = 5,
    device: Any = None,
    setup: Callable[[], Any] | None = None,
    max_over_ranks: bool = True,
    group: Any = None,
) -> list[float]:
    """Seconds of each of ``repeat`` calls of ``op`` (a collective), inside a rank.

    Every iteration: ``setup()`` (untimed, e.g. refill the buffer so repeated sums stay finite),
    a barrier (all ranks start together: we time the collective, not the stragglers), a device
    sync, ``op()``, a sync. The first ``warmup`` iterations pay for connection set-up and
    allocations and are thrown away. With ``max_over_ranks`` each iteration's time is the
    slowest rank's (one all-reduce MAX after the timing, so it does not disturb it): a collective
    is done when its last rank is. Returns the same list on every rank (or this rank's own times).
    Used by notebooks/08_collectives.ipynb and notebooks/13_interconnects_and_backends.ipynb.
    """
    import torch
    import torch.distributed as dist

    from course_lib import validate
    from course_lib.runtime.device import sync

    warmup = validate.count("warmup", warmup, minimum=0)
    repeat = validate.count("repeat", repeat, minimum=1)
    device = torch.device(device) if device is not None else torch.device("cpu")
    times = []
    for it in range(warmup + repeat):
        if setup is not None:
            setup()
        dist.barrier(group=group)
        sync(device)
        t0 = time.perf_counter()
        op()
        sync(device)
        if it >= warmup:
            times.append(time.perf_counter() - t0)
    if not max_over_ranks:
        return times
    t = torch.tensor(times, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return t.cpu().tolist()


CLOCKS: dict[str, Callable[[], int]] = {"monotonic": time.monotonic_ns, "wall": time.time_ns}


class EventLog:
    """Named spans of one rank, on a clock shared by all processes of the host.

    ``with log.span(name, **meta)`` records ``{"rank", "name", "start_ns", "end_ns", "meta"}``
    (also when the block raises). ``sync=True`` synchronizes CUDA at both ends of each span so
    the span covers the GPU work. The log pickles; ``to_records()`` returns plain dicts.
    """

    def __init__(self, rank: int = 0, *, clock: str = "monotonic", sync: bool = False):
        from course_lib import validate

        rank = validate.count("rank", rank, minimum=0)
        clock = validate.choice("clock", clock, CLOCKS)
        self.rank, self.clock, self.sync = rank, clock, bool(sync)
        self._records: list[dict[str, Any]] = []

    def now_ns(self) -> int:
        return CLOCKS[self.clock]()

    @contextmanager
    def span(self, name: str, **meta: Any) -> Iterator[None]:
        if not isinstance(name, str) or not name:
            raise ValueError(f"name = {name!r}: expected a non-empty str")
        from course_lib.runtime.device import sync as device_sync

        if self.sync:
            device_sync()
        start = self.now_ns()
        try:
            yield
        finally:
            if self.sync:
                device_sync()
            self.add(name, start, self.now_ns(), **meta)

    def add(self, name: str, start_ns: int, end_ns: int, **meta: Any) -> None:
        """Record a span measured elsewhere (same clock)."""
        if end_ns < start_ns:
            raise ValueError(
                f"end_ns = {end_ns}: expected >= start_ns = {start_ns} (span {name!r})"
            )
        self._records.append(
            {
                "rank": self.rank,
                "name": name,
                "start_ns": int(start_ns),
                "end_ns": int(end_ns),
                "meta": dict(meta),
            }
        )

    def to_records(self) -> list[dict[str, Any]]:
        """A plain list of dicts (copies), safe to return from a rank."""
        return [{**r, "meta": dict(r["meta"])} for r in self._records]

    def __len__(self) -> int:
        return len(self._records)


def merge_event_logs(logs: Iterable[EventLog | Iterable[Mapping[str, Any]]]) -> pd.DataFrame:
    """One pandas DataFrame from several ranks' logs (EventLogs or their ``to_records()``).

    Columns: rank, name, start, end, duration (seconds; start/end relative to the earliest
    start of all ranks), meta (dict), then one column per meta key. Sorted by start, then rank.
    """
    import pandas as pd

    records: list[Mapping[str, Any]] = []
    for log in logs:
        records.extend(log.to_records() if isinstance(log, EventLog) else log)
    columns = ["rank", "name", "start", "end", "duration", "meta"]
    if not records:
        return pd.DataFrame(columns=columns)
    t0 = min(r["start_ns"] for r in records)
    rows = []
    for r in records:
        meta = dict(r.get("meta", {}))
        rows.append(
            {
                "rank": r["rank"],
                "name": r["name"],
                "start": (r["start_ns"] - t0) / 1e9,
                "end": (r["end_ns"] - t0) / 1e9,
                "duration": (r["end_ns"] - r["start_ns"]) / 1e9,
                "meta": meta,
                **{k: v for k, v in meta.items() if k not in columns},
            }
        )
    df = pd.DataFrame(rows)
    return df.sort_values(["start", "rank"], kind="stable").reset_index(drop=True)
