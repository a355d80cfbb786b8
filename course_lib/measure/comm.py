"""CommMeter: the collective calls one rank makes while a block runs, and the bytes they move.

    from course_lib.measure.comm import CommMeter
    with CommMeter() as comm:                 # inside a rank, process group initialized
        dist.all_reduce(t)
        dist.send(x, dst=1)
    comm.calls             # {"all_reduce": 1, "send": 1}
    comm.wire_bytes_sent   # MEASURED: what this process wrote to its sockets (None if unseen)
    comm.model_bytes_sent  # MODELLED: estimate's figure for each call, summed
    comm.records           # [{"op", "bytes", "model_sent", "wire_sent", "residual", ...}, ...]
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
(measured minus modelled, over the measured records). ``bytes_sent`` no longer exists: it was the
model's figure under a name that read like a measurement.
Introduced in notebooks/08_collectives.ipynb.
"""

from __future__ import annotations

import inspect
from fractions import Fraction
from types import ModuleType
from typing import Any, Iterable

import torch
import torch.distributed as dist

from course_lib.measure import estimate, wire
from course_lib.measure._comm_dispatch import describe_dispatch, make_dispatch_mode
from course_lib.measure._comm_dispatch import nbytes as _nbytes

__all__ = ["CommMeter", "PATCHED_FUNCTIONS"]

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


def _num(x: Fraction | int) -> int | float:
    x = Fraction(x)
    return int(x) if x.denominator == 1 else float(x)


def _group_size(group: Any) -> int:
    if not dist.is_available() or not dist.is_initialized():
        return 1
    return dist.get_world_size(group)


def _group_rank(group: Any) -> int:
    if not dist.is_available() or not dist.is_initialized():
        return 0
    return dist.get_rank(group)


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
    ``model_bytes_received``; both: ``wire_residual``, ``records`` (list of dicts: op, api, bytes,
    model_sent, model_received, wire_sent, residual, wire_window, peer, group_size, async),
    ``summary()``, ``comm_debug_counts`` (CommDebugMode's op -> count), ``rank``.
    """

    def __init__(self, *, dispatch: bool = True, patch_modules: Iterable[ModuleType] = ()):
        self.dispatch = bool(dispatch)
        self._extra_modules = list(patch_modules)
        for i, m in enumerate(self._extra_modules):
            if not isinstance(m, ModuleType):
                raise TypeError(f"patch_modules[{i}] must be a module, got {type(m).__name__}")
        self.records: list[dict[str, Any]] = []
        self.comm_debug_counts: dict[str, int] = {}
        self.rank: int | None = None
        self.wire_source: str = "unavailable: the meter has not run yet"
        self.wire_windows: list[dict[str, Any]] = []
        self.wire_block_bytes: int | None = None
        self._wire: wire.WireWindows | None = None
        self._saved: list[tuple[Any, str, Any]] = []
        self._mode = None
        self._depth = 0
        self._active = False

    # ---- results --------------------------------------------------------------------------
    @property
    def calls(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.records:
            out[r["op"]] = out.get(r["op"], 0) + 1
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
        return sum(w["wire_sent"] for w in self.wire_windows)

    @property
    def model_bytes_sent(self) -> int | float:
        """MODELLED: estimate's bytes sent, summed over every recorded call."""
        return _num(sum(Fraction(r["model_sent"]) for r in self.records))

    @property
    def model_bytes_received(self) -> int | float:
        return _num(sum(Fraction(r["model_received"]) for r in self.records))

    @property
    def wire_residual(self) -> int | float | None:
        """Measured minus modelled bytes sent, over the calls inside measured windows."""
        if not self.wire_available:
            return None
        return _num(sum(Fraction(w["residual"]) for w in self.wire_windows))

    @property
    def bytes_sent(self):
        raise AttributeError(
            "CommMeter.bytes_sent was split in two: model_bytes_sent (estimate's "
            "figure) and wire_bytes_sent (measured by the OS)"
        )

    @property
    def bytes_received(self):
        raise AttributeError(
            "CommMeter.bytes_received is now model_bytes_received (estimate's "
            "figure; received bytes are not measured on the wire)"
        )

    def summary(self) -> dict[str, Any]:
        """Plain dict: rank, calls, wire_source, measured and modelled totals, the residual, how
        many calls have no measurement of their own, p2p and collective subtotals (payload and
        model)."""
        p2p = [r for r in self.records if r["op"] in ("send", "isend", "recv", "irecv")]
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
            "unmeasured_calls": sum(r["wire_window"] is None for r in self.records),
            "p2p_bytes_sent": sum(r["model_sent"] for r in p2p),
            "p2p_bytes_received": sum(r["model_received"] for r in p2p),
            "collective_bytes_in": sum(r["bytes"] for r in coll),
            "collective_model_bytes_sent": _num(sum(Fraction(r["model_sent"]) for r in coll)),
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
        self.rank = dist.get_rank() if initialized else 0
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
            meter._record_call(name, params, result)
            meter._wire.end(first, result, now)
            return result

        wrapper.__wrapped__ = original
        wrapper.__name__ = name
        wrapper.__doc__ = original.__doc__
        return wrapper

    def _add(
        self,
        op: str,
        api: str,
        payload: int,
        sent,
        received,
        peer,
        group_size: int,
        async_op: bool = False,
    ) -> None:
        # wire_sent, residual and wire_window are filled when the call's window closes
        self.records.append(
            {
                "op": op,
                "api": api,
                "bytes": int(payload),
                "model_sent": _num(sent),
                "model_received": _num(received),
                "wire_sent": None,
                "residual": None,
                "wire_window": None,
                "peer": peer,
                "group_size": int(group_size),
                "async": bool(async_op),
            }
        )

    def _record_call(self, name: str, p: dict[str, Any], result: Any) -> None:
        group = p.get("group")
        n = _group_size(group)
        async_op = bool(p.get("async_op", False)) or name in ("isend", "irecv")
        if name in ("send", "isend"):
            b = _nbytes(p["tensor"])
            peer = p.get("dst") if p.get("dst") is not None else p.get("group_dst")
            self._add(name, "c10d", b, b, 0, peer, n, async_op)
        elif name in ("recv", "irecv"):
            b = _nbytes(p["tensor"])
            peer = p.get("src") if p.get("src") is not None else p.get("group_src")
            if name == "recv" and peer is None and isinstance(result, int):
                peer = result  # recv from any source returns the sender's rank
            self._add(name, "c10d", b, 0, b, peer, n, async_op)
        elif name == "batch_isend_irecv":
            for op in p["p2p_op_list"]:
                kind = getattr(op.op, "__name__", str(op.op))
                b = _nbytes(op.tensor)
                peer = getattr(op, "peer", None)
                if "send" in kind:
                    self._add("isend", "c10d", b, b, 0, peer, n, True)
                else:
                    self._add("irecv", "c10d", b, 0, b, peer, n, True)
        elif name == "barrier":
            self._add(name, "c10d", 0, 0, 0, None, n, async_op)
        elif name in ("scatter", "gather"):
            self._record_rooted(name, p, n, async_op)
        elif name in ("all_to_all", "all_to_all_single"):
            self._record_all_to_all(name, p, n, async_op)
        else:
            payload = {
                "all_reduce": lambda: _nbytes(p["tensor"]),
                "broadcast": lambda: _nbytes(p["tensor"]),
                "reduce": lambda: _nbytes(p["tensor"]),
                "all_gather": lambda: _nbytes(p["tensor"]),
                "all_gather_into_tensor": lambda: _nbytes(p["input_tensor"]),
                "all_gather_single": lambda: _nbytes(p["input_tensor"]),
                "reduce_scatter_single": lambda: _nbytes(p["input"]),
                "reduce_scatter": lambda: _nbytes(p["input_list"]),
                "reduce_scatter_tensor": lambda: _nbytes(p["input"]),
            }[name]()
            moved = self._model_bytes(name, payload, n)
            peer = None
            if name == "broadcast":
                peer = p.get("src") if p.get("src") is not None else p.get("group_src")
            elif name == "reduce":
                peer = p.get("dst") if p.get("dst") is not None else p.get("group_dst")
            self._add(name, "c10d", payload, moved, moved, peer, n, async_op)

    @staticmethod
    def _model_bytes(name: str, payload: int, n: int) -> Fraction:
        """estimate's bytes sent by one rank for a collective handed ``payload`` bytes."""
        if n <= 1:
            return Fraction(0)
        if name.startswith("all_gather"):  # estimate's S is the output: n shards
            name, payload = "all_gather", n * payload
        elif name.startswith("reduce_scatter"):
            name = "reduce_scatter"
        elif name.startswith("all_to_all"):
            name = "all_to_all"
        if name not in estimate.COLLECTIVES:  # a dispatched barrier, send or recv
            return Fraction(payload if name == "send" else 0)
        value = estimate.collective_bytes_sent(name, payload, n)
        return Fraction(value).limit_denominator(n)  # exact: a multiple of 1/n

    def _record_all_to_all(self, name: str, p: dict[str, Any], n: int, async_op: bool) -> None:
        # a direct exchange: exact bytes addressed to / received from the other ranks
        me = _group_rank(p.get("group"))
        if name == "all_to_all":
            ins, outs = list(p["input_tensor_list"]), list(p["output_tensor_list"])
            payload = _nbytes(ins)
            sent = payload - (_nbytes(ins[me]) if me < len(ins) else 0)
            received = _nbytes(outs) - (_nbytes(outs[me]) if me < len(outs) else 0)
        else:

            def others(t: torch.Tensor, splits) -> Fraction:
                total = _nbytes(t)
                if not splits:  # even split along dim 0
                    return Fraction(total * (n - 1), n)
                row = Fraction(total, max(1, t.shape[0]))
                return total - row * splits[me]

            payload = _nbytes(p["input"])
            sent = others(p["input"], p.get("input_split_sizes"))
            received = others(p["output"], p.get("output_split_sizes"))
        self._add(name, "c10d", payload, sent, received, None, n, async_op)

    def _record_rooted(self, name: str, p: dict[str, Any], n: int, async_op: bool) -> None:
        root_key, group_root_key = (
            ("src", "group_src") if name == "scatter" else ("dst", "group_dst")
        )
        if p.get(root_key) is not None:  # a global rank
            root, is_root = (
                p[root_key],
                p[root_key] == (dist.get_rank() if dist.is_initialized() else 0),
            )
        else:  # a rank in the group (torch defaults to 0 when neither is given)
            root = p.get(group_root_key) or 0
            is_root = root == _group_rank(p.get("group"))
        chunk = _nbytes(p["tensor"])
        others = chunk * (n - 1)
        if name == "scatter":  # root sends every other rank its chunk
            sent, received = (others, 0) if is_root else (0, chunk)
        else:  # gather: every other rank sends its chunk to the root
            sent, received = (0, others) if is_root else (chunk, 0)
        self._add(name, "c10d", chunk, sent, received, root, n, async_op)

    def _record_dispatch(self, func, args, kwargs, api: str) -> None:
        base, payload, n = describe_dispatch(func, args, api)
        if base in ("scatter", "gather"):
            moved = Fraction(0)  # rooted: not attributed without the root (rare outside c10d)
        else:
            moved = self._model_bytes(base, payload, n)
        self._add(base, api, payload, moved, moved, None, n)
        self._wire.join(len(self.records) - 1)
