"""CommMeter: the collective calls one rank makes while a block runs, and the bytes they move.

    from course_lib.measure.comm import CommMeter
    with CommMeter() as comm:                 # inside a rank, process group initialized
        dist.all_reduce(t)
        dist.send(x, dst=1)
    comm.calls             # {"all_reduce": 1, "send": 1}
    comm.wire_bytes_sent   # MEASURED: what this process wrote to its sockets (None if unseen)
    comm.model_bytes_sent  # MODELLED: estimate's figure for each call, summed
    comm.records           # [CommRecord(op, api, bytes, model_sent, ..., wire_sent, residual)]
    comm.wire_source       # "/proc/self/io wchar (gloo over TCP)" or "unavailable: <reason>"

Two numbers per call, never mixed up:

* **measured** -- ``wire_sent``: bytes the operating system saw this process write while the call
  ran (``course_lib.measure.wire``: ``/proc/self/io`` ``wchar`` read just before and just after
  the call; gloo over TCP on Linux). It includes message headers and is whatever algorithm the
  library really ran. ``None`` where the OS cannot see the traffic (``wire_source`` says why),
  and for calls that share a measurement window with others (asynchronous calls waited
  together; their measured total is in ``wire_windows``).
* **modelled** -- ``model_sent`` / ``model_received``: what ``course_lib.measure.estimate``
  predicts this rank sends/receives (below). ``residual`` = ``wire_sent - model_sent``.

Where the calls come from, merged into one list of records:

1. **Direct ``torch.distributed`` calls** (``api="c10d"``): for the duration of the block the
   functions below are replaced, on the ``torch.distributed`` and
   ``torch.distributed.distributed_c10d`` modules (and on ``patch_modules`` you pass, for code
   that did ``from torch.distributed import all_reduce``), by wrappers that record the call and
   then call the original. They are restored on exit, also when the block raises.
   Counted: send, isend, recv, irecv, batch_isend_irecv (each P2POp), all_reduce, broadcast,
   reduce, all_gather, all_gather_into_tensor / all_gather_single (torch 2.13's new name; the old
   one now calls it, and only the outermost call is counted), reduce_scatter,
   reduce_scatter_tensor / reduce_scatter_single, scatter,
   gather, all_to_all, all_to_all_single, barrier.
2. **Operators seen by PyTorch's ``CommDebugMode``** (``torch.distributed.tensor.debug``), a
   ``TorchDispatchMode``: functional collectives (``torch.distributed._functional_collectives``,
   what DTensor and ``parallelize_module`` use; ``api="functional"``) and c10d operators issued
   from C++ outside a Python call we wrapped, e.g. the gradient buckets of DDP's reducer
   (``api="dispatch"``). ``comm_debug_counts`` keeps CommDebugMode's own counts. These run
   asynchronously outside any call window, so their ``wire_sent`` is None (unless a window of a
   wrapped call happens to be open); ``wire_block_bytes`` (everything the process wrote during the
   block) still includes their traffic.

Model convention (per rank; bytes = tensor ``numel * element_size``):

* ``bytes``: the payload this rank hands to the call -- its input tensor(s) (for all_gather the
  local shard, for reduce_scatter/all_to_all the whole input, for send the tensor, for recv the
  buffer it fills).
* point-to-point: the exact payload (send/isend: ``model_sent``, recv/irecv: ``model_received``;
  estimate's ``send_recv``); ``peer`` is the other rank (for ``recv`` without ``src``, the rank it
  came from).
* collectives: ``estimate.collective_bytes_sent``, the bandwidth-optimal **ring** figures:
  all_reduce 2(N-1)/N S; all_gather (N-1) S_shard; reduce_scatter (N-1)/N S_in; broadcast and
  reduce (N-1)/N S (a ring pipeline, averaged over ranks). Exact where the algorithm is a direct
  exchange: all_to_all(_single) (the chunks addressed to / coming from other ranks), scatter/gather
  (the root sends / receives every other rank's chunk). Libraries pick other algorithms: gloo's
  broadcast is a tree (2 S at the root of 4 ranks, S at one rank, 0 at the others) and its
  reduce_scatter moves what an all-reduce moves (2(N-1)/N S_in). The residual shows it.

Totals: ``wire_bytes_sent`` (sum of the measured windows; None if unavailable),
``model_bytes_sent`` / ``model_bytes_received`` (sum over all records), ``wire_residual``
(measured minus modelled, over the measured records).
Introduced in notebooks/08_collectives.ipynb.
"""

from __future__ import annotations

import functools
import inspect
from fractions import Fraction
from types import ModuleType
from typing import Any, Iterable

import torch.distributed as dist

from course_lib.measure import wire
from course_lib.measure._comm_dispatch import describe_dispatch, make_dispatch_mode
from course_lib.measure._comm_records import (
    Api,
    CommRecord,
    model_bytes,
    record,
    records_of_call,
)
from course_lib.measure._comm_records import number as _num
from course_lib.runtime.groups import group_info

__all__ = ["CommMeter", "CommRecord", "PATCHED_FUNCTIONS", "collective_family"]

#: torch.distributed functions CommMeter wraps
PATCHED_FUNCTIONS = (
    "send",
    "isend",
    "recv",
    "irecv",
    "batch_isend_irecv",
    "all_reduce",
    "broadcast",
    "reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_single",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "reduce_scatter_single",
    "scatter",
    "gather",
    "all_to_all",
    "all_to_all_single",
    "barrier",
)


# torch 2.13 renamed the flat-tensor collectives (runtime/compat.py); a record keeps the name that
# was called, and a table shows the collective's family, the same on every supported torch.
_FAMILY = {
    "all_gather_into_tensor": "all_gather",
    "reduce_scatter_tensor": "reduce_scatter",
}


def collective_family(op: str) -> str:
    """``"all_gather"`` for ``all_gather_single`` and ``all_gather_into_tensor`` (likewise for
    reduce-scatter and ``all_to_all_single``); any other name unchanged."""
    return _FAMILY.get(op, op.removesuffix("_single"))


class CommMeter:
    """Count collective calls and bytes of this rank while the block runs (module docstring).

    Args:
        dispatch: also count functional collectives and C++-issued c10d operators through
            CommDebugMode (a TorchDispatchMode: every operator in the block pays a small
            Python overhead; pass False to count direct torch.distributed calls only).
        patch_modules: extra modules whose attributes named like ``PATCHED_FUNCTIONS`` are
            replaced too (code that imported the functions by name).

    Results (plain data): ``calls`` (op -> count); measured: ``wire_bytes_sent``,
    ``wire_windows``, ``wire_block_bytes``, ``wire_source``; modelled: ``model_bytes_sent``,
    ``model_bytes_received``; both: ``wire_residual``, ``records`` (list of :class:`CommRecord`:
    op, api, bytes, model_sent, model_received, wire_sent, residual, wire_window, peer,
    group_size, async_op; ``record["op"]`` works too),
    ``summary()``, ``comm_debug_counts`` (CommDebugMode's op -> count), ``rank``.
    """

    def __init__(self, *, dispatch: bool = True, patch_modules: Iterable[ModuleType] = ()):
        self.dispatch = bool(dispatch)
        self._extra_modules = list(patch_modules)
        for i, m in enumerate(self._extra_modules):
            if not isinstance(m, ModuleType):
                raise TypeError(
                    f"patch_modules[{i}] = {m!r}: expected a module (got {type(m).__name__})"
                )
        self.records: list[CommRecord] = []
        self.comm_debug_counts: dict[str, int] = {}
        self.rank: int | None = None
        self.wire_source: str = "unavailable: the meter has not run yet"
        self.wire_windows: list[wire.WireWindow] = []
        self.wire_block_bytes: int | None = None
        self._wire: wire.WireWindows | None = None
        self._saved: list[tuple[Any, str, Any]] = []
        self._mode: Any = None  # the CommDebugMode while the block runs
        self._depth = 0
        self._active = False

    # ---- results --------------------------------------------------------------------------
    @property
    def calls(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.records:
            out[r.op] = out.get(r.op, 0) + 1
        return out

    @property
    def wire_available(self) -> bool:
        return self.wire_source == wire.GLOO_SOURCE

    @property
    def wire_bytes_sent(self) -> int | None:
        """MEASURED: bytes the OS saw this process write during the wrapped calls (None where it
        cannot see the traffic; see ``wire_source``)."""
        if not self.wire_available:
            return None
        return sum(w.wire_sent for w in self.wire_windows)

    @property
    def model_bytes_sent(self) -> int | float:
        """MODELLED: estimate's bytes sent, summed over every recorded call."""
        return _num(sum(Fraction(r.model_sent) for r in self.records))

    @property
    def model_bytes_received(self) -> int | float:
        return _num(sum(Fraction(r.model_received) for r in self.records))

    @property
    def wire_residual(self) -> int | float | None:
        """Measured minus modelled bytes sent, over the calls inside measured windows."""
        if not self.wire_available:
            return None
        return _num(sum(Fraction(w.residual) for w in self.wire_windows))

    def summary(self) -> dict[str, Any]:
        """Plain dict: rank, calls, wire_source, measured and modelled totals, the residual, how
        many calls have no measurement of their own, p2p and collective subtotals (payload and
        model)."""
        p2p = [r for r in self.records if r.op in ("send", "isend", "recv", "irecv")]
        coll = [r for r in self.records if r not in p2p]
        return {
            "rank": self.rank,
            "calls": self.calls,
            "wire_source": self.wire_source,
            "wire_bytes_sent": self.wire_bytes_sent,
            "model_bytes_sent": self.model_bytes_sent,
            "model_bytes_received": self.model_bytes_received,
            "wire_residual": self.wire_residual,
            "wire_block_bytes": self.wire_block_bytes,
            "unmeasured_calls": sum(r.wire_window is None for r in self.records),
            "p2p_bytes_sent": sum(r.model_sent for r in p2p),
            "p2p_bytes_received": sum(r.model_received for r in p2p),
            "collective_bytes_in": sum(r.bytes for r in coll),
            "collective_model_bytes_sent": _num(sum(Fraction(r.model_sent) for r in coll)),
        }

    def __getstate__(self) -> dict[str, Any]:
        if self._active:
            raise RuntimeError("a running CommMeter cannot be pickled; leave the block first")
        state = dict(self.__dict__)
        state["_extra_modules"] = []
        state["_wire"] = None
        return state

    def __repr__(self) -> str:
        return (
            f"CommMeter(rank={self.rank}, calls={self.calls}, wire_bytes_sent="
            f"{self.wire_bytes_sent}, model_bytes_sent={self.model_bytes_sent})"
        )

    # ---- context manager ------------------------------------------------------------------
    def __enter__(self) -> "CommMeter":
        if self._active:
            raise RuntimeError("this CommMeter is already running; use a new one per block")
        self.records = []
        initialized = dist.is_available() and dist.is_initialized()
        self.rank = group_info(needs="CommMeter", single=True).rank
        self.wire_source = wire.wire_source(dist.get_backend() if initialized else None)
        self._wire = wire.WireWindows(self.records, self.wire_source)
        self.wire_windows, self.wire_block_bytes = self._wire.windows, None  # live during the block
        modules = [dist, dist.distributed_c10d, *self._extra_modules]
        try:
            for name in PATCHED_FUNCTIONS:
                original = getattr(dist.distributed_c10d, name, None)
                if original is None:
                    continue
                wrapper = self._wrap(name, original)
                for module in modules:
                    current = getattr(module, name, None)
                    if current is not None:
                        self._saved.append((module, name, current))
                        setattr(module, name, wrapper)
            if self.dispatch:
                self._mode = make_dispatch_mode(self)
                self._mode.__enter__()
            self._wire.start()
        except BaseException:
            self._restore()
            raise
        self._active = True
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if self._mode is not None:
                self._mode.__exit__(exc_type, exc, tb)
                self.comm_debug_counts = {
                    str(k): int(v) for k, v in self._mode.get_comm_counts().items()
                }
        finally:
            self._mode = None
            try:
                assert self._wire is not None  # made by __enter__
                self._wire.stop()
                self.wire_block_bytes = self._wire.block_bytes
            finally:
                self._restore()
                self._active = False

    def _restore(self) -> None:
        if self._wire is not None:
            self._wire.restore()
        for module, name, original in reversed(self._saved):
            setattr(module, name, original)
        self._saved = []

    # ---- recording ------------------------------------------------------------------------
    def _wrap(self, name: str, original):
        sig = inspect.signature(original)
        meter = self

        def wrapper(*args, **kwargs):
            if meter._depth > 0:  # called from inside another wrapped call: counted there
                return original(*args, **kwargs)
            try:
                bound = sig.bind(*args, **kwargs)
                bound.apply_defaults()
                params = bound.arguments
            except TypeError:
                return original(*args, **kwargs)  # let torch raise its own error
            meter._depth += 1
            meter._wire.begin()
            first = len(meter.records)
            try:
                result = original(*args, **kwargs)
            except BaseException:
                meter._wire.end(first, None, None)
                raise
            finally:
                meter._depth -= 1
            now = meter._wire.mark()  # read before any bookkeeping: the window stays tight
            meter.records.extend(records_of_call(name, params, result))
            meter._wire.end(first, result, now)
            return result

        functools.update_wrapper(wrapper, original, assigned=("__doc__",), updated=())
        wrapper.__name__ = name
        return wrapper

    def _record_dispatch(self, func: Any, args: Any, kwargs: Any, api: Api) -> None:
        base, payload, n = describe_dispatch(func, args, api)
        if base in ("scatter", "gather"):
            moved = Fraction(0)  # rooted: not attributed without the root (rare outside c10d)
        else:
            moved = model_bytes(base, payload, n)
        self.records.append(record(base, api, payload, moved, moved, None, n))
        assert self._wire is not None  # the dispatcher records only inside the block
        self._wire.join(len(self.records) - 1)
