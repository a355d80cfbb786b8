"""CommMeter: count the collective calls and bytes one rank sends while a block runs.

    from course_lib.measure.comm import CommMeter
    with CommMeter() as comm:                 # inside a rank, process group initialized
        dist.all_reduce(t)
        dist.send(x, dst=1)
    comm.calls          # {"all_reduce": 1, "send": 1}
    comm.bytes_sent     # exact for send, ring-algorithm figure for all_reduce (see below)
    comm.records        # [{"op", "bytes", "peer", ...}, ...]  plain data, returnable from a rank

Two sources, merged into one list of records:

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
   (``api="dispatch"``). ``comm_debug_counts`` keeps CommDebugMode's own counts.

Bytes convention (per rank, bytes = tensor ``numel * element_size``):

* ``bytes``: the payload this rank hands to the call -- its input tensor(s) (for all_gather the
  local shard, for reduce_scatter/all_to_all the whole input, for send the tensor, for recv the
  buffer it fills).
* point-to-point: ``sent``/``received`` are the exact payload (send/isend: sent, recv/irecv:
  received); ``peer`` is the other rank (for ``recv`` without ``src``, the rank it came from).
* collectives: ``sent``/``received`` are the bytes the bandwidth-optimal **ring** algorithm
  moves through this rank (``estimate.collective_bytes_sent``): all_reduce 2(N-1)/N S; all_gather
  (N-1) S_shard; reduce_scatter (N-1)/N S_in; broadcast and reduce (N-1)/N S (a ring pipeline in
  which N-1 of the N ranks forward the payload, averaged over ranks). Exact where the algorithm
  is a direct exchange: all_to_all(_single) (the chunks addressed to / coming from other ranks),
  scatter/gather (the root sends / receives every other rank's chunk).
  Real libraries may pick other algorithms (trees, direct copies), so these are the figures the
  course's formulas predict, not wire measurements.

``bytes_sent`` / ``bytes_received`` sum ``sent`` / ``received`` over all records.
Introduced in notebooks/08_collectives.ipynb.
"""
from __future__ import annotations

import inspect
from fractions import Fraction
from types import ModuleType
from typing import Any, Iterable

import torch
import torch.distributed as dist

from course_lib.measure import estimate

__all__ = ["CommMeter", "PATCHED_FUNCTIONS"]

#: torch.distributed functions CommMeter wraps
PATCHED_FUNCTIONS = (
    "send", "isend", "recv", "irecv", "batch_isend_irecv",
    "all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor",
    "all_gather_single", "reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single",
    "scatter", "gather", "all_to_all",
    "all_to_all_single", "barrier",
)


def _nbytes(obj: Any) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, (list, tuple)):
        return sum(_nbytes(o) for o in obj)
    return 0


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


# operator names (overload packet, trailing "_" removed) -> the torch.distributed function name
_DISPATCH_NAMES = {
    "allreduce": "all_reduce", "allreduce_coalesced": "all_reduce",
    "all_reduce_coalesced": "all_reduce",
    "allgather": "all_gather", "allgather_coalesced": "all_gather",
    "_allgather_base": "all_gather_into_tensor",
    "allgather_into_tensor_coalesced": "all_gather_into_tensor",
    "all_gather_into_tensor_coalesced": "all_gather_into_tensor",
    "_reduce_scatter_base": "reduce_scatter_tensor",
    "reduce_scatter_tensor_coalesced": "reduce_scatter_tensor",
    "alltoall": "all_to_all", "alltoall_base": "all_to_all_single",
    "shard_dim_alltoall": "all_to_all",
}


class _DispatchCounter:
    """CommDebugMode subclass that also records the payload of each operator it counts."""

    def __new__(cls, meter: "CommMeter"):
        from torch.distributed.tensor.debug import CommDebugMode
        from torch.distributed.tensor.debug._comm_mode import c10d_collective_ops

        class _Mode(CommDebugMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = super().__torch_dispatch__(func, types, args, kwargs)
                if out is NotImplemented or meter._depth > 0:
                    return out  # a wrapped Python call already recorded it
                packet = getattr(func, "_overloadpacket", None)
                if packet in self.comm_registry:
                    meter._record_dispatch(func, args, kwargs or {}, "functional")
                elif packet in c10d_collective_ops:
                    meter._record_dispatch(func, args, kwargs or {}, "dispatch")
                return out

        return _Mode()


class CommMeter:
    """Count collective calls and bytes of this rank while the block runs (module docstring).

    Args:
        dispatch: also count functional collectives and C++-issued c10d operators through
            CommDebugMode (a TorchDispatchMode: every operator in the block pays a small
            Python overhead; pass False to count direct torch.distributed calls only).
        patch_modules: extra modules whose attributes named like ``PATCHED_FUNCTIONS`` are
            replaced too (code that imported the functions by name).

    Results (plain data): ``calls`` (op -> count), ``bytes_sent``, ``bytes_received``,
    ``records`` (list of dicts: op, api, bytes, sent, received, peer, group_size, async),
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
    def bytes_sent(self) -> int | float:
        return _num(sum(Fraction(r["sent"]) for r in self.records))

    @property
    def bytes_received(self) -> int | float:
        return _num(sum(Fraction(r["received"]) for r in self.records))

    def summary(self) -> dict[str, Any]:
        """Plain dict: rank, calls, bytes_sent, bytes_received, p2p and collective subtotals."""
        p2p = [r for r in self.records if r["op"] in ("send", "isend", "recv", "irecv")]
        coll = [r for r in self.records if r not in p2p]
        return {"rank": self.rank, "calls": self.calls, "bytes_sent": self.bytes_sent,
                "bytes_received": self.bytes_received,
                "p2p_bytes_sent": sum(r["sent"] for r in p2p),
                "p2p_bytes_received": sum(r["received"] for r in p2p),
                "collective_bytes_in": sum(r["bytes"] for r in coll),
                "collective_bytes_sent": _num(sum(Fraction(r["sent"]) for r in coll))}

    def __getstate__(self) -> dict[str, Any]:
        if self._active:
            raise RuntimeError("a running CommMeter cannot be pickled; leave the block first")
        state = dict(self.__dict__)
        state["_extra_modules"] = []
        return state

    def __repr__(self) -> str:
        return f"CommMeter(rank={self.rank}, calls={self.calls}, bytes_sent={self.bytes_sent})"

    # ---- context manager ------------------------------------------------------------------
    def __enter__(self) -> "CommMeter":
        if self._active:
            raise RuntimeError("this CommMeter is already running; use a new one per block")
        self.records = []
        self.rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
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
                self._mode = _DispatchCounter(self)
                self._mode.__enter__()
        except BaseException:
            self._restore()
            raise
        self._active = True
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if self._mode is not None:
                self._mode.__exit__(exc_type, exc, tb)
                self.comm_debug_counts = {str(k): int(v) for k, v in self._mode.get_comm_counts().items()}
        finally:
            self._mode = None
            self._restore()
            self._active = False

    def _restore(self) -> None:
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
            try:
                result = original(*args, **kwargs)
            finally:
                meter._depth -= 1
            meter._record_call(name, params, result)
            return result

        wrapper.__wrapped__ = original
        wrapper.__name__ = name
        wrapper.__doc__ = original.__doc__
        return wrapper

    def _add(self, op: str, api: str, payload: int, sent, received, peer, group_size: int,
             async_op: bool = False) -> None:
        self.records.append({"op": op, "api": api, "bytes": int(payload), "sent": _num(sent),
                             "received": _num(received), "peer": peer,
                             "group_size": int(group_size), "async": bool(async_op)})

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
            moved = self._ring_bytes(name, payload, n)
            peer = None
            if name == "broadcast":
                peer = p.get("src") if p.get("src") is not None else p.get("group_src")
            elif name == "reduce":
                peer = p.get("dst") if p.get("dst") is not None else p.get("group_dst")
            self._add(name, "c10d", payload, moved, moved, peer, n, async_op)

    @staticmethod
    def _ring_bytes(name: str, payload: int, n: int) -> Fraction:
        if n <= 1:
            return Fraction(0)
        if name == "all_reduce":
            return Fraction(estimate.ring_allreduce_bytes_sent(payload, n)).limit_denominator(n)
        if name in ("all_gather", "all_gather_into_tensor", "all_gather_single"):
            return Fraction((n - 1) * payload)  # output is n shards; forward n-1 of them
        # reduce_scatter, all_to_all, broadcast, reduce: (n-1)/n of the payload
        return Fraction((n - 1) * payload, n)

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
        root_key, group_root_key = ("src", "group_src") if name == "scatter" else ("dst", "group_dst")
        if p.get(root_key) is not None:  # a global rank
            root, is_root = p[root_key], p[root_key] == (dist.get_rank() if dist.is_initialized() else 0)
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
        name = str(getattr(func, "_overloadpacket", func)).split(".")[-1].rstrip("_")
        base = _DISPATCH_NAMES.get(name, name)
        if api == "dispatch":
            # c10d operators take (outputs, inputs, ...) except the in-place ones
            in_place = base in ("all_reduce", "broadcast", "reduce")
            payload = _nbytes(args[0] if in_place else args[1])
            n = self._dispatch_group_size(args)
        else:
            payload = _nbytes(args[0])
            ints = [a for a in args[1:] if isinstance(a, int) and not isinstance(a, bool)]
            n = ints[0] if base in ("all_gather_into_tensor", "reduce_scatter_tensor") and ints \
                else self._dispatch_group_size(args)
        if base in ("scatter", "gather"):
            moved = Fraction(0)  # rooted: not attributed without the root (rare outside c10d)
        else:
            moved = self._ring_bytes(base, payload, n)
        self._add(base, api, payload, moved, moved, None, n)

    @staticmethod
    def _dispatch_group_size(args) -> int:
        for a in args:
            if isinstance(a, dist.ProcessGroup):
                return a.size()
            if isinstance(a, str):  # functional collectives name their group
                try:
                    return dist.distributed_c10d._resolve_process_group(a).size()
                except Exception:
                    continue
        return _group_size(None)
