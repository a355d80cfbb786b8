"""What a learner's code hands to torch.distributed inside a rank, as plain records: the learner's
side of a rank check that counts calls and bytes (units 08 and 09), and the judge's reading of them.

:class:`~course_lib.measure.comm.CommMeter` counts the same calls, but it prices every collective
with ``estimate.collective_bytes_sent`` as it records it, and estimate's byte formulas are answers
in the units that grade them: the grade's sandbox makes them absent
(:mod:`course_lib.grading.absent`). :class:`CallLog` keeps only what the code did: the op, the
bytes of the payload it handed over, and whether the call was asynchronous; the judge prices the
calls itself (:func:`sent_bytes`, :func:`other_calls`) after checking what came back
(:func:`need_records`, :func:`need_runs`). Import-light: torch is imported inside the functions.
"""

from __future__ import annotations

import inspect
from typing import Any

__all__ = ["CallLog", "P2P_SENDS", "need_records", "need_runs", "other_calls", "sent_bytes"]

#: the calls whose payload a rank sends to one peer (their model is the payload itself)
P2P_SENDS = ("send", "isend")

#: the argument that holds this rank's payload, first match wins
_PAYLOAD_KEYS = ("tensor", "input_tensor", "input", "input_list", "input_tensor_list")


def _records(name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    from course_lib.measure._comm_dispatch import nbytes as _nbytes  # CommMeter's payload bytes

    if name == "batch_isend_irecv":  # one record per P2POp, as CommMeter files them
        out = []
        for op in params.get("p2p_op_list") or ():
            kind = "isend" if "send" in getattr(op.op, "__name__", str(op.op)) else "irecv"
            out.append({"op": kind, "bytes": _nbytes(op.tensor), "async": True})
        return out
    key = next((k for k in _PAYLOAD_KEYS if k in params), None)
    payload = _nbytes(params[key]) if key is not None else 0
    is_async = bool(params.get("async_op", False)) or name in ("isend", "irecv")
    return [{"op": name, "bytes": payload, "async": is_async}]


class CallLog:
    """Record this rank's direct ``torch.distributed`` calls while the block runs (the functions
    CommMeter wraps, with ``dispatch=False``): ``records``, a list of ``{"op", "bytes",
    "async"}``; ``calls``, op -> count. A call made inside another logged call is counted there."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []
        self._saved: list[tuple[Any, str, Any]] = []
        self._depth = 0

    @property
    def calls(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.records:
            out[r["op"]] = out.get(r["op"], 0) + 1
        return out

    def __enter__(self) -> CallLog:
        import torch.distributed as dist

        from course_lib.measure.comm import PATCHED_FUNCTIONS

        for name in PATCHED_FUNCTIONS:
            original = getattr(dist.distributed_c10d, name, None)
            if original is None:
                continue
            wrapper = self._wrap(name, original)
            for module in (dist, dist.distributed_c10d):
                current = getattr(module, name, None)
                if current is not None:
                    self._saved.append((module, name, current))
                    setattr(module, name, wrapper)
        return self

    def __exit__(self, *exc: Any) -> None:
        for module, name, original in reversed(self._saved):
            setattr(module, name, original)
        self._saved = []

    def _wrap(self, name: str, original: Any) -> Any:
        sig = inspect.signature(original)
        log = self

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if log._depth > 0:
                return original(*args, **kwargs)
            try:
                bound = sig.bind(*args, **kwargs)
            except TypeError:
                return original(*args, **kwargs)  # torch raises its own error
            bound.apply_defaults()
            log._depth += 1
            try:
                result = original(*args, **kwargs)
            finally:
                log._depth -= 1
            log.records.extend(_records(name, dict(bound.arguments)))
            return result

        wrapper.__name__ = name
        wrapper.__doc__ = original.__doc__
        return wrapper


# ------------------------------------------------------------------------ the judge's reading
def sent_bytes(records: list[dict[str, Any]]) -> int:
    """Bytes a rank sent to its peers through point-to-point calls (the model of a send: its
    payload; a receive sends nothing)."""
    return sum(r["bytes"] for r in records if r["op"] in P2P_SENDS)


def other_calls(records: list[dict[str, Any]]) -> dict[str, int]:
    """The calls that are not point-to-point (a ring built from send/recv makes none)."""
    out: dict[str, int] = {}
    for r in records:
        if "send" not in r["op"] and "recv" not in r["op"]:
            out[r["op"]] = out.get(r["op"], 0) + 1
    return out


def need_records(task: int, value: Any, where: str) -> list[dict[str, Any]]:
    """``value`` if it is a list of call records as :class:`CallLog` writes them; otherwise the
    ✗ verdict (the judge trusts nothing it is handed)."""
    from course_lib.grading.core import fail

    def ok(r: Any) -> bool:
        return (
            isinstance(r, dict)
            and isinstance(r.get("op"), str)
            and type(r.get("bytes")) is int
            and isinstance(r.get("async"), bool)
        )

    if not isinstance(value, list) or not all(ok(r) for r in value):
        fail(task, f"{where}: the run handed back no list of calls")
    return value


def need_runs(task: int, data: Any, world_sizes: tuple[int, ...]) -> list[list[dict[str, Any]]]:
    """``data["runs"]``: one list of per-rank dicts for each world size; otherwise the ✗ verdict."""
    from course_lib.grading.core import fail

    runs = data.get("runs") if isinstance(data, dict) else None
    if not (
        isinstance(runs, list)
        and len(runs) == len(world_sizes)
        and all(
            isinstance(ranks, list) and len(ranks) == n and all(isinstance(r, dict) for r in ranks)
            for ranks, n in zip(runs, world_sizes)
        )
    ):
        sizes = ", ".join(map(str, world_sizes))
        fail(task, f"the run handed back no results for {sizes} ranks")
    return runs
