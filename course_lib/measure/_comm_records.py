"""One record per collective call :class:`~course_lib.measure.comm.CommMeter` sees: what the
call was handed and what ``estimate`` says this rank sends and receives for it (the model
convention is in comm.py's docstring). Introduced in notebooks/08_collectives.ipynb.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from fractions import Fraction
from typing import Any, Literal

import torch

from course_lib.measure import estimate
from course_lib.measure._comm_dispatch import nbytes
from course_lib.runtime.groups import GroupInfo, group_info

Api = Literal["c10d", "functional", "dispatch"]  # a wrapped call, or one the dispatcher saw


@dataclass(frozen=True)
class CommRecord:
    """One collective or point-to-point call of this rank.

    ``record["op"]`` works too (units and tests read records as mappings; ``"async"`` is
    ``async_op``), and :meth:`as_dict` gives the plain dict with those keys."""

    op: str  # the torch.distributed function name
    api: Api
    bytes: int  # the payload this rank handed to the call
    model_sent: int | float  # MODELLED: estimate's bytes sent / received by this rank
    model_received: int | float
    peer: int | None  # the other rank (p2p), or the root (broadcast, reduce, scatter, gather)
    group_size: int
    async_op: bool = False
    wire_sent: int | None = None  # MEASURED, when the call had a window of its own
    residual: int | float | None = None  # wire_sent - model_sent
    wire_window: int | None = None  # index into CommMeter.wire_windows, if measured

    def __getitem__(self, key: str) -> Any:
        return getattr(self, "async_op" if key == "async" else key)

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["async"] = out.pop("async_op")
        return out


def number(x: Fraction | int) -> int | float:
    """An exact byte count as an int, or a float where the model gives a fraction."""
    x = Fraction(x)
    return int(x) if x.denominator == 1 else float(x)


def record(
    op: str,
    api: Api,
    payload: int,
    sent: Fraction | int,
    received: Fraction | int,
    peer: int | None,
    group_size: int,
    async_op: bool = False,
) -> CommRecord:
    # wire_sent, residual and wire_window are filled when the call's window closes
    return CommRecord(
        op, api, int(payload), number(sent), number(received), peer, int(group_size), async_op
    )


def _place(group: Any) -> GroupInfo:
    """This rank's place in a call's ``group`` (rank 0 of 1 outside a process group)."""
    return group_info(group, needs="CommMeter", single=True)


def model_bytes(name: str, payload: int, n: int) -> Fraction:
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


_PAYLOAD_ARGUMENT = {  # collective -> the argument holding this rank's payload
    "all_reduce": "tensor",
    "broadcast": "tensor",
    "reduce": "tensor",
    "all_gather": "tensor",
    "all_gather_into_tensor": "input_tensor",
    "all_gather_single": "input_tensor",
    "reduce_scatter_single": "input",
    "reduce_scatter": "input_list",
    "reduce_scatter_tensor": "input",
}


def _either(p: dict[str, Any], key: str, group_key: str) -> Any:
    return p.get(key) if p.get(key) is not None else p.get(group_key)


def records_of_call(name: str, p: dict[str, Any], result: Any) -> list[CommRecord]:
    """The records of one wrapped ``torch.distributed`` call with bound arguments ``p``."""
    n = _place(p.get("group")).world_size
    async_op = bool(p.get("async_op", False)) or name in ("isend", "irecv")
    if name in ("send", "isend"):
        b = nbytes(p["tensor"])
        return [record(name, "c10d", b, b, 0, _either(p, "dst", "group_dst"), n, async_op)]
    if name in ("recv", "irecv"):
        b = nbytes(p["tensor"])
        peer = _either(p, "src", "group_src")
        if name == "recv" and peer is None and isinstance(result, int):
            peer = result  # recv from any source returns the sender's rank
        return [record(name, "c10d", b, 0, b, peer, n, async_op)]
    if name == "batch_isend_irecv":
        return [_p2p_op(op, n) for op in p["p2p_op_list"]]
    if name == "barrier":
        return [record(name, "c10d", 0, 0, 0, None, n, async_op)]
    if name in ("scatter", "gather"):
        return [rooted_record(name, p, n, async_op)]
    if name in ("all_to_all", "all_to_all_single"):
        return [_all_to_all(name, p, n, async_op)]
    payload = nbytes(p[_PAYLOAD_ARGUMENT[name]])
    moved = model_bytes(name, payload, n)
    peer = None
    if name == "broadcast":
        peer = _either(p, "src", "group_src")
    elif name == "reduce":
        peer = _either(p, "dst", "group_dst")
    return [record(name, "c10d", payload, moved, moved, peer, n, async_op)]


def _p2p_op(op: Any, n: int) -> CommRecord:
    """One P2POp of ``batch_isend_irecv``."""
    kind = getattr(op.op, "__name__", str(op.op))
    b = nbytes(op.tensor)
    peer = getattr(op, "peer", None)
    if "send" in kind:
        return record("isend", "c10d", b, b, 0, peer, n, True)
    return record("irecv", "c10d", b, 0, b, peer, n, True)


def _all_to_all(name: str, p: dict[str, Any], n: int, async_op: bool) -> CommRecord:
    # a direct exchange: exact bytes addressed to / received from the other ranks
    me = _place(p.get("group")).rank
    if name == "all_to_all":
        ins, outs = list(p["input_tensor_list"]), list(p["output_tensor_list"])
        payload = nbytes(ins)
        sent: Fraction | int = payload - (nbytes(ins[me]) if me < len(ins) else 0)
        received: Fraction | int = nbytes(outs) - (nbytes(outs[me]) if me < len(outs) else 0)
    else:

        def others(t: torch.Tensor, splits: Sequence[int] | None) -> Fraction:
            total = nbytes(t)
            if not splits:  # even split along dim 0
                return Fraction(total * (n - 1), n)
            row = Fraction(total, max(1, t.shape[0]))
            return total - row * splits[me]

        payload = nbytes(p["input"])
        sent = others(p["input"], p.get("input_split_sizes"))
        received = others(p["output"], p.get("output_split_sizes"))
    return record(name, "c10d", payload, sent, received, None, n, async_op)


def rooted_record(name: str, p: dict[str, Any], n: int, async_op: bool) -> CommRecord:
    root_key, group_root_key = ("src", "group_src") if name == "scatter" else ("dst", "group_dst")
    if p.get(root_key) is not None:  # a global rank
        root = p[root_key]
        is_root = root == _place(None).rank  # the global rank
    else:  # a rank in the group (torch defaults to 0 when neither is given)
        root = p.get(group_root_key) or 0
        is_root = root == _place(p.get("group")).rank
    chunk = nbytes(p["tensor"])
    others = chunk * (n - 1)
    if name == "scatter":  # root sends every other rank its chunk
        sent, received = (others, 0) if is_root else (0, chunk)
    else:  # gather: every other rank sends its chunk to the root
        sent, received = (0, others) if is_root else (chunk, 0)
    return record(name, "c10d", chunk, sent, received, root, n, async_op)
