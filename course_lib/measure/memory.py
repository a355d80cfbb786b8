"""MemoryMeter: tensor memory of a block of PyTorch code, by category, at its peak and over time.

    from course_lib import MemoryMeter
    with MemoryMeter(model, optimizer) as mem:
        loss = model(x).pow(2).mean(); loss.backward(); optimizer.step()
    mem.peak_bytes, mem.peak_breakdown, mem.end_breakdown, mem.timeline

Built on PyTorch's ``MemTracker`` (``torch.distributed._tools.mem_tracker``), a
``TorchDispatchMode`` that sees every tensor an operator creates and follows its storage until
it is freed. That API is private; this file and its adapter ``_mem_tracker.py`` are the only
places in the course that touch it, and
tests/measure/test_memory.py pins the behaviour we rely on.

Categories (bytes of tensor storage, exact on CPU; on CUDA MemTracker rounds each storage up to
the allocator's 512-byte blocks):

==============  ==============================================================================
params          ``nn.Parameter`` storages and module buffers (MemTracker's PARAM + BUFFER)
grads           ``.grad`` of parameters (GRAD)
optimizer       tensors in ``optimizer.state`` (OPT) -- moments, momentum buffers and torch.optim's
                scalar ``step`` counters. Tensors the step allocates and frees again are
                moved to *temporaries* (MemTracker labels them OPT while the step runs).
activations     tensors created outside backward and outside the optimizer step (ACT): what
                autograd saves for backward, the outputs, and forward transients alive at
                that moment
temporaries     tensors created during backward that are not gradients of parameters (TEMP:
                gradients of activations, scratch), plus the step's transient buffers
other           tensors passed with ``track=`` (MemTracker's "Other"), e.g. the input batch
==============  ==============================================================================

Inputs: a tensor created *before* the block (the batch ``x``) is not counted unless passed as
``MemoryMeter(model, opt, track=(x,))`` (then it is *other*); a tensor created inside the block,
outside any backward or step, is an *activation*.

What the adapter adds to MemTracker: the mapping above; the optimizer-transient correction; a
chronological ``timeline`` (MemTracker only keeps per-module snapshots) recorded at every module
pre/post forward/backward hook and optimizer pre/post step, plus a ``peak`` row placed where the
peak happened; repeated calls of the root module (several steps or micro-batches in one block;
MemTracker raises NotImplementedError there) by restarting its per-module statistics; the CUDA
allocator's own peaks (``cuda_peak_allocated``/``cuda_peak_reserved``); and plain, picklable
results, so a rank started by ``course_lib.launch`` can return the meter.

Under ``FakeTensorMode`` nothing is allocated: a 7B-parameter training step is measured from the
shapes alone (``mem.simulated`` is True then; say so when showing the numbers). About 10 s and
0.4 GB of RAM on one CPU core for Llama-7B, sequence 512, AdamW::

    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        model = Llama(LlamaConfig.llama_7b_like()); opt = torch.optim.AdamW(model.parameters())
        idx = torch.randint(0, 32000, (1, 512))
        with MemoryMeter(model, opt) as mem:
            model.loss(idx, idx).backward(); opt.step()
Introduced in notebooks/01_backprop_memory.ipynb.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any, Iterable, TypeVar

import torch
from torch import nn

from course_lib.validate import describe

if TYPE_CHECKING:
    import pandas as pd  # imported when a block ends: ranks that never meter skip it

    # imported when a block starts: torch's MemTracker pulls in torch.distributed's FSDP, DTensor,
    # dynamo and sympy, ~3 s of CPU that a process importing this module without metering (a
    # rank, a torchrun script, a grading kernel) would pay
    from course_lib.measure._mem_tracker import _Tracker

__all__ = ["MemoryMeter", "CATEGORIES"]

#: our categories, in the order plots stack them
CATEGORIES = ("params", "grads", "optimizer", "activations", "temporaries", "other")

T = TypeVar("T")


class MemoryMeter:
    """Measure tensor memory by category while a block runs (see the module docstring).

    Args:
        model: module(s) whose parameters, buffers and gradients are counted from the start
            (``None`` if the block creates them).
        optimizer: optimizer(s) whose existing state is counted from the start; any optimizer
            that steps inside the block is tracked anyway.
        track: extra tensors created before the block to count as *other* (e.g. the input batch).
        device: device whose memory is reported (default: the model's, else "cpu"). Peaks of
            every device seen are in ``peak_bytes_by_device``.

    Results (plain data, available after the block; the meter pickles):
        ``peak_bytes`` (int), ``peak_breakdown`` (category -> bytes at the peak, sums to
        ``peak_bytes``), ``peak_phase`` ("forward"/"backward"/"step"), ``end_breakdown``
        (alive when the block ends), ``start_breakdown``, ``timeline`` (pandas DataFrame),
        ``peak_bytes_by_device``, ``cuda_peak_allocated`` / ``cuda_peak_reserved`` (the CUDA
        caching allocator's own peaks in bytes during the block; None on CPU and under
        FakeTensorMode), ``simulated`` (True under FakeTensorMode).
    """

    def __init__(
        self,
        model: nn.Module | Iterable[nn.Module] | None = None,
        optimizer: torch.optim.Optimizer | Iterable[torch.optim.Optimizer] | None = None,
        *,
        track: Iterable[torch.Tensor] = (),
        device: str | torch.device | None = None,
    ):
        self._model = _as_list(model, nn.Module, "model")
        self._optimizer = _as_list(optimizer, torch.optim.Optimizer, "optimizer")
        self._track = list(track)
        for i, t in enumerate(self._track):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"track[{i}] = {describe(t)}: expected a torch.Tensor")
        self.device = _device_name(device) if device is not None else self._default_device()
        self._tracker: _Tracker | None = None
        self._warnings: warnings.catch_warnings[None] | None = None
        # results, known once the block has run (read through the properties below)
        self._peak_bytes: int | None = None
        self._peak_breakdown: dict[str, int] | None = None
        self._peak_phase: str | None = None
        self._start_breakdown: dict[str, int] | None = None
        self._end_breakdown: dict[str, int] | None = None
        self._timeline: pd.DataFrame | None = None
        self.peak_bytes_by_device: dict[str, int] = {}
        self.cuda_peak_allocated: int | None = None
        self.cuda_peak_reserved: int | None = None
        self.simulated = False

    @staticmethod
    def _known(value: T | None, name: str) -> T:
        if value is None:
            raise RuntimeError(f"MemoryMeter.{name} is known once the measured block has run")
        return value

    @property
    def peak_bytes(self) -> int:
        """Bytes alive at the peak on ``device``."""
        return self._known(self._peak_bytes, "peak_bytes")

    @property
    def peak_breakdown(self) -> dict[str, int]:
        """Category -> bytes at the peak (sums to ``peak_bytes``)."""
        return self._known(self._peak_breakdown, "peak_breakdown")

    @property
    def peak_phase(self) -> str:
        """ "forward", "backward", "step" (or "start" when nothing grew)."""
        return self._known(self._peak_phase, "peak_phase")

    @property
    def start_breakdown(self) -> dict[str, int]:
        """Category -> bytes alive when the block starts."""
        return self._known(self._start_breakdown, "start_breakdown")

    @property
    def end_breakdown(self) -> dict[str, int]:
        """Category -> bytes alive when the block ends."""
        return self._known(self._end_breakdown, "end_breakdown")

    @property
    def timeline(self) -> pd.DataFrame:
        """One row per recorded event (module hooks, optimizer step) and a ``peak`` row."""
        return self._known(self._timeline, "timeline")

    def _default_device(self) -> str:
        for m in self._model:
            for t in (*m.parameters(), *m.buffers()):
                return str(t.device)
        for opt in self._optimizer:
            for group in opt.param_groups:
                for p in group["params"]:
                    return str(p.device)
        return "cpu"

    def _on_cuda(self) -> bool:
        return self.device.startswith("cuda") and torch.cuda.is_available() and not self.simulated

    def __enter__(self) -> "MemoryMeter":
        if self._tracker is not None or self._peak_bytes is not None:
            raise RuntimeError("a MemoryMeter measures one block; create a new one for the next")
        from torch._guards import active_fake_mode

        self.simulated = active_fake_mode() is not None or any(
            _is_fake(p) for m in self._model for p in m.parameters()
        )
        if self._on_cuda():
            torch.cuda.reset_peak_memory_stats(self.device)
        from course_lib.measure._mem_tracker import _Tracker

        tracker = _Tracker(self.device, CATEGORIES)
        tracker.track_external(*self._model, *self._optimizer, *self._track)
        self._tracker = tracker
        # MemTracker's backward hooks make PyTorch warn when no input of a module requires grad
        # (always true of the first layer); harmless here, so silenced for the block only
        self._warnings = warnings.catch_warnings()
        self._warnings.__enter__()
        warnings.filterwarnings(
            "ignore", message="Full backward hook is firing", category=UserWarning
        )
        tracker.__enter__()
        tracker.record("start", phase="start")
        self._start_breakdown = tracker.breakdown(self.device)
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        tracker = self._known(self._tracker, "tracker")
        try:
            tracker.record("end", phase="end")
        finally:
            try:
                tracker.__exit__(exc_type, exc, tb)
            finally:
                if self._warnings is not None:
                    self._warnings.__exit__(None, None, None)
                self._warnings = None
        self._end_breakdown = tracker.breakdown(self.device)
        start_total = sum(self.start_breakdown.values())
        total, bd, op, phase = tracker.peaks.get(
            self.device, (start_total, dict(self.start_breakdown), 0, "start")
        )
        self._peak_bytes, self._peak_breakdown, self._peak_phase = int(total), dict(bd), phase
        self.peak_bytes_by_device = {dev: int(p[0]) for dev, p in tracker.peaks.items()}
        self.peak_bytes_by_device.setdefault(self.device, int(total))
        rows = list(tracker.rows)
        peak_row = {
            "op": op,
            "event": "peak",
            "module": "",
            "phase": phase,
            **bd,
            "total": int(total),
        }
        # place the peak row after every row recorded at or before the op that reached it
        index = next(
            (i for i, r in enumerate(rows) if r["op"] >= op and r["event"] != "start"), len(rows)
        )
        rows.insert(index, peak_row)
        import pandas as pd

        self._timeline = pd.DataFrame(
            rows, columns=["op", "event", "module", "phase", *CATEGORIES, "total"]
        )
        if self._on_cuda():
            self.cuda_peak_allocated = int(torch.cuda.max_memory_allocated(self.device))
            self.cuda_peak_reserved = int(torch.cuda.max_memory_reserved(self.device))
        # drop every reference to tensors, modules and the tracker: results are plain data
        self._tracker = None
        self._model, self._optimizer, self._track = [], [], []

    def summary(self) -> dict[str, Any]:
        """Plain dict of the results (bytes)."""
        return {
            "device": self.device,
            "simulated": self.simulated,
            "peak_bytes": self._peak_bytes,
            "peak_phase": self._peak_phase,
            "peak_breakdown": self._peak_breakdown,
            "end_breakdown": self._end_breakdown,
            "cuda_peak_allocated": self.cuda_peak_allocated,
            "cuda_peak_reserved": self.cuda_peak_reserved,
        }

    def __getstate__(self) -> dict[str, Any]:
        if self._tracker is not None:
            raise RuntimeError("a running MemoryMeter cannot be pickled; leave the block first")
        return dict(self.__dict__)

    def __repr__(self) -> str:
        if self._peak_bytes is None:
            return f"MemoryMeter(device={self.device!r}, not run yet)"
        from course_lib.measure.estimate import fmt_bytes

        parts = ", ".join(f"{k}={fmt_bytes(v)}" for k, v in self.peak_breakdown.items() if v)
        sim = ", simulated" if self.simulated else ""
        return (
            f"MemoryMeter(device={self.device!r}{sim}, peak={fmt_bytes(self.peak_bytes)}: {parts})"
        )


def _device_name(device: str | torch.device) -> str:
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(
            f"device = {device!r}: expected a valid torch device (e.g. 'cpu', 'cuda:0')"
        ) from err
    if dev.type == "cuda" and not _simulating():  # under FakeTensorMode any device is pretend
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0 or (dev.index or 0) >= count:
            raise ValueError(
                f"device = {str(device)!r}: expected a device this machine has: 'cpu'"
                + (f" or cuda:0 to cuda:{count - 1}" if count else " (it has no CUDA device)")
            )
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())  # tensors report "cuda:0"
    return str(dev)


def _simulating() -> bool:
    from torch._guards import active_fake_mode

    return active_fake_mode() is not None


def _is_fake(t: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(t, FakeTensor)


def _as_list(obj: Any, cls: type[T], name: str) -> list[T]:
    """``obj`` (one ``cls``, an iterable of them, or None) as a list; TypeError naming the value."""
    if obj is None:
        return []
    if isinstance(obj, cls):
        return [obj]
    kind = {nn.Module: "torch.nn.Module", torch.optim.Optimizer: "torch.optim.Optimizer"}[cls]
    if isinstance(obj, (nn.Module, torch.Tensor, str)) or not isinstance(obj, Iterable):
        raise TypeError(f"{name} = {describe(obj)}: expected a {kind}, a list of them or None")
    items = list(obj)
    for i, item in enumerate(items):
        if not isinstance(item, cls):
            raise TypeError(f"{name}[{i}] = {describe(item)}: expected a {kind}")
    return items
