"""Bytes on the wire as the operating system counts them, for CommMeter.

Linux keeps, per process, the number of bytes the process handed to ``write``/``writev`` calls:
``wchar`` in ``/proc/self/io`` (all threads of the process together). gloo's TCP transport writes
its sockets with such calls, so the growth of ``wchar`` across a gloo collective is what the
collective put on the wire from this rank, message headers included. Facts this module relies
on, measured with torch 2.13 / gloo on Linux:

* gloo frames every message: a ``send`` of k bytes writes k + 96 B at the sender and 48 B at
  the receiver (a short message of its own), whatever k is; a collective pays a few such
  overheads per message, e.g. 1,728 B in all for a 1 MiB all_reduce on 4 ranks (0.16 % of S);
* ``send()``/``sendmsg()`` are *not* counted in ``wchar`` (a library that writes its sockets with
  them would be invisible here), nor are ``recv()`` reads in ``rchar``; gloo's reads do not show
  up in ``rchar`` either (it grows by ~100 B, not by the MiB received), so received bytes are not
  measured;
* every other write of the process is counted too: a ``print`` flushed to a file, a log line, a
  warning written to stderr (``dist.all_gather_into_tensor`` writes ~250 B of FutureWarning the
  first time it is called). CommMeter therefore reads the counter immediately before and after
  each call, never around user code.

Where the counter cannot see the traffic -- not Linux, no readable ``/proc/self/io``, or a
backend whose transfers are not writes of this process (NCCL copies over NVLink/PCIe or RDMA by
DMA) -- :func:`wire_source` says why, and CommMeter reports ``wire_sent = None``.

Windows. A synchronous call is measured from its start to its return. An asynchronous one
(``isend``/``irecv``, ``async_op=True``, ``batch_isend_irecv``) may write from a gloo thread
until its ``wait()`` returns, so a window opens when the first such call starts and closes when
the last ``wait()`` on its ``Work`` objects returns (``Work.wait`` is wrapped while the meter
runs); every call made while a window is open joins it. A window holding one call gives that
call's ``wire_sent``; a window shared by several (an ``isend`` and an ``irecv`` waited together)
gives one measured total for the group, recorded in ``CommMeter.wire_windows``; the calls in it
have ``wire_sent = None``, so nothing is split by a formula. A ``Work`` that is never waited
with ``wait()`` (polled, or awaited through its future) keeps its window open until the block
ends. Introduced in notebooks/08_collectives.ipynb.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import TYPE_CHECKING, Any

import torch.distributed as dist

if TYPE_CHECKING:
    from course_lib.measure._comm_records import CommRecord

__all__ = ["GLOO_SOURCE", "read_wchar", "wire_source", "WireWindows"]

#: CommMeter.wire_source when the wire is measured
GLOO_SOURCE = "/proc/self/io wchar (gloo over TCP)"
_PROC_IO = "/proc/self/io"


def read_wchar() -> int:
    """Bytes this process has handed to write calls so far (``wchar`` of ``/proc/self/io``).

    Raises OSError where the file does not exist or is unreadable. Reading it does not write
    (it grows ``rchar``, not ``wchar``)."""
    with open(_PROC_IO, "rb") as f:
        for line in f.read().splitlines():
            if line.startswith(b"wchar:"):
                return int(line.split()[1])
    raise OSError(f"{_PROC_IO} has no wchar line")


def wire_source(backend: str | None) -> str:
    """Where wire bytes come from for ``backend`` on this system: :data:`GLOO_SOURCE`, or
    ``"unavailable: <reason>"``."""
    if not sys.platform.startswith("linux"):
        return (
            f"unavailable: {sys.platform} has no /proc/self/io (per-process write counters "
            "are a Linux feature); wire bytes are not measured"
        )
    try:
        read_wchar()
    except (OSError, ValueError) as exc:
        return f"unavailable: cannot read {_PROC_IO} ({exc}); wire bytes are not measured"
    if backend is None:
        return "unavailable: no process group is initialized"
    if backend != "gloo":
        # under NCCL the course's ranks join "cpu:gloo,cuda:nccl": CPU tensors do go through
        # gloo's sockets, but a call's window cannot tell them from CUDA ones, so none is counted
        return (
            f"unavailable: the {backend} backend moves CUDA tensors without write calls "
            "of this process (NCCL copies over NVLink/PCIe or RDMA by DMA), so "
            "/proc/self/io cannot see them; only the model's bytes are reported (run with "
            "backend='gloo' to measure CPU tensors' wire bytes)"
        )
    return GLOO_SOURCE


def _works(result: Any) -> list[Any]:
    """The Work objects an asynchronous call returned (one, a list, or none)."""
    work_type = dist.distributed_c10d.Work
    if isinstance(result, work_type):
        return [result]
    if isinstance(result, (list, tuple)):
        return [w for w in result if isinstance(w, work_type)]
    return []


def _number(x: Any) -> int | float:
    x = Fraction(x)
    return int(x) if x.denominator == 1 else float(x)


@dataclass(frozen=True)
class WireWindow:
    """One closed measurement window (``window["wire_sent"]`` reads it too)."""

    records: list[int]  # indices into CommMeter.records of the calls in it
    ops: list[str]  # their names
    wire_sent: int  # MEASURED: bytes the process wrote while the window was open
    model_sent: int | float  # MODELLED: estimate's bytes for those calls, summed
    residual: int | float  # wire_sent - model_sent

    def __getitem__(self, key: str) -> Any:
        return getattr(self, key)


@dataclass
class _OpenWindow:
    start: int  # the counter when it opened
    records: list[int] = field(default_factory=list)
    pending: dict[int, Any] = field(default_factory=dict)  # id -> Work not waited on yet


class WireWindows:
    """The measurement windows of one CommMeter block (module docstring, "Windows").

    ``records`` is the meter's list of :class:`~course_lib.measure.comm.CommRecord`: closing a
    window replaces the records in it by copies with ``wire_sent``, ``residual`` and
    ``wire_window`` filled in. ``windows``: the closed :class:`WireWindow` s.
    """

    def __init__(self, records: list[CommRecord], source: str):
        self.records = records
        self.source = source
        self.available = source == GLOO_SOURCE
        self.windows: list[WireWindow] = []
        self.block_bytes: int | None = None
        self._open: _OpenWindow | None = None
        self._block_start: int | None = None
        self._saved_wait: tuple[bool, Any] | None = None

    # ---- block ----------------------------------------------------------------------------
    def start(self) -> None:
        if not self.available:
            return
        self._block_start = _read()
        work = dist.distributed_c10d.Work
        self._saved_wait = ("wait" in work.__dict__, work.__dict__.get("wait"))
        original, tracker = work.wait, self

        def wait(w: Any, *args: Any, **kwargs: Any) -> Any:
            window = tracker._open
            if window is None or id(w) not in window.pending:
                return original(w, *args, **kwargs)
            try:
                return original(w, *args, **kwargs)
            finally:
                window.pending.pop(id(w), None)
                if not window.pending and tracker._open is window:
                    tracker._close(_read())

        wait.__doc__ = getattr(original, "__doc__", None)
        setattr(work, "wait", wait)  # noqa: B010 - patched for the block (mypy: a method)

    def stop(self) -> None:
        """Close an open window (a Work never waited on), restore Work.wait, total the block."""
        if not self.available:
            return
        end = _read()
        if self._open is not None:
            self._close(end)
        assert self._block_start is not None  # set by start()
        self.block_bytes = end - self._block_start
        self.restore()

    def restore(self) -> None:
        if self._saved_wait is not None:
            had, value = self._saved_wait
            work = dist.distributed_c10d.Work
            if had:
                setattr(work, "wait", value)  # noqa: B010 - restored (mypy: a method)
            else:
                delattr(work, "wait")
            self._saved_wait = None
        self._open = None

    # ---- calls ----------------------------------------------------------------------------
    def begin(self) -> None:
        """A wrapped call is about to start: open a window unless one is open."""
        if self.available and self._open is None:
            self._open = _OpenWindow(_read())

    def mark(self) -> int | None:
        """The counter right after a call returned (read before any bookkeeping)."""
        return _read() if self.available and self._open is not None else None

    def end(self, first: int, result: Any, now: int | None) -> None:
        """The call returned ``result`` and added records ``first:``; close the window unless an
        asynchronous call in it is still pending."""
        window = self._open
        if window is None:
            return
        window.records.extend(range(first, len(self.records)))
        for w in _works(result):
            window.pending[id(w)] = w  # keep it alive: ids are never reused while pending
        if not window.pending:
            self._close(now if now is not None else _read())

    def join(self, index: int) -> None:
        """A record seen by the dispatcher: measured only if a window is open."""
        if self._open is not None:
            self._open.records.append(index)

    def _close(self, end: int) -> None:
        window, self._open = self._open, None
        assert window is not None  # only called with a window open
        indices = window.records
        if not indices:  # the call raised before it was recorded: nothing to attribute
            return
        wire = end - window.start
        model = _number(sum(Fraction(self.records[i].model_sent) for i in indices))
        number = len(self.windows)
        residual = _number(wire - Fraction(model))
        ops = [self.records[i].op for i in indices]
        self.windows.append(WireWindow(list(indices), ops, wire, model, residual))
        for i in indices:
            self.records[i] = replace(self.records[i], wire_window=number)
        if len(indices) == 1:
            only = self.records[indices[0]]
            self.records[indices[0]] = replace(only, wire_sent=wire, residual=residual)


def _read() -> int:
    # looked up through the module so that a test can replace read_wchar and prove where the
    # numbers come from
    counter: int = sys.modules[__name__].read_wchar()
    return counter
