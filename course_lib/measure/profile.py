"""Profile one step with ``torch.profiler``: a typed operator table, a timeline, a trace file.

    from course_lib.measure.profile import profile_step
    prof = profile_step(lambda: model.loss(x, y).backward(), trace_path="step.json")
    prof.table()        # one row per operator: calls, self / total CPU time, device time, FLOPs
    prof.timeline()     # one row per top-level event: thread, start, duration, kind
    prof.comm()         # the collectives (gloo / NCCL), e.g. DDP's bucket all-reduces

The table and the timeline are frozen dataclass rows (:class:`OpRow`, :class:`Span`), shown as
DataFrames with the declared columns ``OP_COLUMNS`` / ``SPAN_COLUMNS``. A :class:`StepProfile`
is plain data: a rank started by ``course_lib.launch`` can return it. The trace file
(``export_chrome_trace``) opens in Perfetto (ui.perfetto.dev) or ``chrome://tracing``.

Times are the profiler's, in microseconds, from the start of the profiled step. On CPU the
profiler sees operators, autograd's backward functions and gloo's collectives (on gloo's own
threads); on CUDA it adds the kernels on each stream (``device_us``). The profiler itself
costs a few microseconds per operator: compare operators with each other, not with a step timed
without it. Introduced in notebooks/19_inside_the_step.ipynb.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any, Literal

from course_lib import validate

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "OpRow",
    "Span",
    "StepProfile",
    "profile_step",
    "span_kind",
    "OP_COLUMNS",
    "SPAN_COLUMNS",
    "COMM_PREFIXES",
]

#: event names that are a collective: gloo's and NCCL's work items, c10d's dispatch, NCCL kernels
COMM_PREFIXES = ("gloo:", "nccl:", "c10d::", "ncclDevKernel", "ncclKernel")
#: native log lines torch.profiler prints on every start and stop (kineto, the CPU allocator)
_NOISE = ("SyncActivityProfilerHandler", "allocated before the profiling started")

SpanKind = Literal["comm", "backward", "kernel", "op"]


@dataclass(frozen=True)
class OpRow:
    """One operator of the step, summed over its calls (``key_averages``)."""

    name: str  #: operator name, e.g. "aten::mm" or "gloo:all_reduce"
    calls: int  #: how many times it ran in the step
    self_cpu_us: float  #: CPU time inside it, its children excluded, µs
    cpu_total_us: float  #: CPU time with its children, µs
    device_us: float  #: time of its own kernels on the GPU, µs (0 on CPU)
    flops: int  #: FLOPs the profiler counts for it (matmuls and convolutions only; else 0)
    self_cpu_memory_bytes: int  #: bytes it allocated minus freed on CPU (with profile_memory)


@dataclass(frozen=True)
class Span:
    """One top-level event of the timeline (an operator, a backward node, a collective, a
    kernel): where it ran and when."""

    name: str  #: event name
    thread: int  #: thread id (CPU) or stream id (kernels)
    start_us: float  #: start from the beginning of the step, µs
    duration_us: float  #: duration, µs
    kind: SpanKind  #: "comm", "backward" (an autograd node), "kernel" (GPU) or "op"


OP_COLUMNS = tuple(f.name for f in fields(OpRow))
SPAN_COLUMNS = tuple(f.name for f in fields(Span))


def span_kind(name: str, *, on_device: bool = False) -> SpanKind:
    """The kind of an event from its name (and whether it ran on a GPU)."""
    if name.startswith(COMM_PREFIXES):
        return "comm"
    if on_device:
        return "kernel"
    if name.startswith("autograd::engine") or "Backward" in name:
        return "backward"
    return "op"


@dataclass(frozen=True)
class StepProfile:
    """What :func:`profile_step` saw: operators, top-level spans, the trace file written."""

    rank: int  #: the rank that profiled (0 outside a launch)
    ops: tuple[OpRow, ...]  #: one row per operator, by self CPU time, largest first
    spans: tuple[Span, ...]  #: top-level events by start time
    trace_path: str | None  #: the Chrome trace file, if one was asked for
    wall_us: float  #: first start to last end of the spans, µs

    def table(self) -> pd.DataFrame:
        """The operators as a DataFrame with columns ``OP_COLUMNS``."""
        import pandas as pd

        return pd.DataFrame([asdict(r) for r in self.ops], columns=list(OP_COLUMNS))

    def timeline(self) -> pd.DataFrame:
        """The spans as a DataFrame with columns ``SPAN_COLUMNS`` (plus ``rank``)."""
        import pandas as pd

        df = pd.DataFrame([asdict(s) for s in self.spans], columns=list(SPAN_COLUMNS))
        df["rank"] = self.rank
        return df

    def comm(self) -> list[Span]:
        """The collectives of the step, in start order (what gloo or NCCL ran, not c10d's
        dispatch, which only queues the work)."""
        return [s for s in self.spans if s.kind == "comm" and not s.name.startswith("c10d::")]

    def hidden_us(self, span: Span) -> float:
        """How much of ``span`` ran while a backward node (or a GPU kernel) ran on another
        thread or stream: communication hidden under compute, µs. Forward operators do not
        count: DDP's forward waits in them for its own broadcast."""
        busy = [
            (s.start_us, s.start_us + s.duration_us)
            for s in self.spans
            if s.kind in ("backward", "kernel") and s.thread != span.thread
        ]
        return _covered(span.start_us, span.start_us + span.duration_us, busy)


def _covered(start: float, end: float, intervals: list[tuple[float, float]]) -> float:
    """Length of [start, end] covered by the union of ``intervals``."""
    total, cursor = 0.0, start
    for a, b in sorted(intervals):
        a, b = max(a, cursor), min(b, end)
        if b > a:
            total += b - a
            cursor = b
    return total


@contextlib.contextmanager
def _quiet_profiler_logs() -> Iterator[None]:
    """Hide the native log lines torch.profiler writes to file descriptor 2 on every start and
    stop (a Jupyter kernel shows them as cell output); every other line written there
    meanwhile is written again afterwards. Python's ``sys.stderr`` is left alone."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except OSError:  # no descriptor 2 in this process: nothing to hide
        yield
        return
    with tempfile.TemporaryFile(mode="w+b") as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            kept = [
                line
                for line in sink.read().splitlines(keepends=True)
                if not any(mark.encode() in line for mark in _NOISE)
            ]
            if kept:
                os.write(2, b"".join(kept))


def profile_step(
    step: Callable[[], Any],
    *,
    warmup: int = 1,
    trace_path: str | os.PathLike[str] | None = None,
    rank: int = 0,
    profile_memory: bool = False,
    record_shapes: bool = False,
) -> StepProfile:
    """Run ``step()`` ``warmup`` times, then once under ``torch.profiler`` (CPU, and CUDA when
    CUDA is initialised), and return the :class:`StepProfile`. ``trace_path``: write the
    Chrome trace there (a ``.json`` file). ``profile_memory`` adds the per-operator memory
    column; ``record_shapes`` the input shapes in the trace."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    if not callable(step):
        raise TypeError(f"step = {validate.describe(step)}: expected a callable")
    warmup = validate.count("warmup", warmup, minimum=0)
    rank = validate.count("rank", rank, minimum=0)
    for _ in range(warmup):
        step()
    activities = [ProfilerActivity.CPU]
    on_cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    if on_cuda:
        activities.append(ProfilerActivity.CUDA)
        torch.cuda.synchronize()
    with _quiet_profiler_logs():
        with profile(
            activities=activities,
            with_flops=True,
            profile_memory=profile_memory,
            record_shapes=record_shapes,
        ) as prof:
            step()
            if on_cuda:
                torch.cuda.synchronize()
    path = None if trace_path is None else os.fspath(trace_path)
    if path is not None:
        prof.export_chrome_trace(path)
    spans, wall_us = _spans(prof)
    return StepProfile(rank, _op_rows(prof), spans, path, wall_us)


def _op_rows(prof: Any) -> tuple[OpRow, ...]:
    rows = [
        OpRow(
            name=e.key,
            calls=int(e.count),
            self_cpu_us=float(e.self_cpu_time_total),
            cpu_total_us=float(e.cpu_time_total),
            device_us=float(e.self_device_time_total),
            flops=int(e.flops or 0),
            self_cpu_memory_bytes=int(e.self_cpu_memory_usage),
        )
        for e in prof.key_averages()
        if e.key != "[memory]"
    ]
    return tuple(sorted(rows, key=lambda r: (-r.self_cpu_us, r.name)))


def _spans(prof: Any) -> tuple[tuple[Span, ...], float]:
    """Top-level CPU events and every GPU kernel, times from the first start; and the wall time."""
    from torch.autograd import DeviceType

    raw = []
    for e in prof.events():
        on_device = e.device_type != DeviceType.CPU
        if e.name == "[memory]" or (e.cpu_parent is not None and not on_device):
            continue
        start, end = float(e.time_range.start), float(e.time_range.end)
        thread = int(e.device_resource_id if on_device else e.thread)
        raw.append((start, end, e.name, thread, span_kind(e.name, on_device=on_device)))
    if not raw:
        return (), 0.0
    t0 = min(r[0] for r in raw)
    spans = tuple(
        Span(name, thread, start - t0, end - start, kind)
        for start, end, name, thread, kind in sorted(raw)
    )
    return spans, max(r[1] for r in raw) - t0
