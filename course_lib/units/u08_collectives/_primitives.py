"""What runs inside the ranks in unit 08: the primitives on N-slot rows, and the launch/meter helpers.

Shared by :mod:`run` (before/after pictures, bytes), :mod:`run_wire` (wire bytes of every
collective) and :mod:`run_timing` (all-reduce timings). Introduced in notebooks/08_collectives.ipynb.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from course_lib import validate
from course_lib.measure import estimate
from course_lib.parallel import collectives as C

if TYPE_CHECKING:
    from course_lib.measure.comm import CommMeter

#: the eight primitives of torch.distributed shown in the notebook, in teaching order
PRIMITIVES = (
    "broadcast",
    "scatter",
    "gather",
    "reduce",
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
)
#: the from-scratch all-reduce algorithms of course_lib.parallel.collectives, by name
ALGORITHMS = tuple(C.ALL_REDUCE_ALGORITHMS)
#: what the byte experiments can run: the from-scratch all-reduces plus the composite
#: reduce-scatter + all-gather (both rings from scratch)
BYTE_EXPERIMENTS = ALGORITHMS + ("reduce_scatter+all_gather",)
#: what the timing experiments can run: from-scratch algorithms and gloo's own all_reduce
TIMED = ALGORITHMS + ("gloo",)
#: everything the widget can run
COLLECTIVE_CHOICES = PRIMITIVES + tuple(f"{name} (from scratch)" for name in ALGORITHMS)

WORKED_EXAMPLE_GRADS = (0.20, 0.10, -0.05, 0.15)


def _launch(
    fn: Callable[..., Any], world_size: int, *args: Any, timeout: float = 60.0, **kwargs: Any
) -> list[Any]:
    from course_lib.runtime.launch import launch  # imported here: ranks never need it

    return launch(fn, world_size, *args, timeout=timeout, **kwargs)


def _meter() -> CommMeter:
    from course_lib.measure.comm import CommMeter

    # direct torch.distributed calls are all we make; dispatch=True would also import
    # torch.distributed.tensor in every rank (seconds of start-up) to see DTensor collectives
    return CommMeter(dispatch=False)


# --------------------------------------------------------------------------------------------
# 1. the eight primitives: before / after on every rank
# --------------------------------------------------------------------------------------------
def piece_value(rank: int, piece: int) -> float:
    """The value rank ``rank`` starts with in slot ``piece``: 10 * rank + piece.

    Tens digit = who owns it, units digit = which piece, so pictures and sums read at a glance
    (all-reduce of piece 1 on 4 ranks: 1 + 11 + 21 + 31 = 64).
    """
    return float(10 * rank + piece)


def _row(rank: int, world_size: int, k: int = 1) -> torch.Tensor:
    values = torch.tensor([piece_value(rank, c) for c in range(world_size)])  # (N,)
    return values.repeat_interleave(k)  # (N*k,) slot c = elements c*k .. c*k+k-1


def _only(slot: int, value: torch.Tensor, world_size: int, k: int = 1) -> torch.Tensor:
    """An N-slot row (k elements per slot) that is empty (NaN) except at ``slot``."""
    row = _empty(world_size, k)
    row[slot * k : (slot + 1) * k] = value.reshape(-1)
    return row


def _empty(world_size: int, k: int = 1) -> torch.Tensor:
    return torch.full((world_size * k,), float("nan"))


def _run_rooted(name: str, me: int, n: int, root: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """broadcast, scatter, gather, reduce: (before, after) as N-slot rows (see _run_primitive)."""
    is_root = me == root
    if name == "broadcast":
        buf = _row(me, n, k) if is_root else _empty(n, k)  # non-roots pass an empty (NaN) buffer
        before = buf.clone()
        dist.broadcast(buf, src=root)
        return before, buf
    if name == "scatter":
        full = _row(me, n, k) if is_root else _empty(n, k)
        out = torch.empty(k)
        dist.scatter(out, scatter_list=list(full.chunk(n)) if is_root else None, src=root)
        return full, _only(me, out, n, k)
    if name == "gather":
        mine = torch.full((k,), piece_value(me, me))
        pieces = [torch.empty(k) for _ in range(n)]
        dist.gather(mine, gather_list=pieces if is_root else None, dst=root)
        return _only(me, mine, n, k), (torch.cat(pieces) if is_root else _empty(n, k))
    if name == "reduce":
        buf = _row(me, n, k)
        before = buf.clone()
        dist.reduce(buf, dst=root)
        # only the destination's buffer is defined after a reduce; the others are scratch
        return before, (buf if is_root else _empty(n, k))
    raise ValueError(f"name = {name!r}: expected a rooted primitive")


def _run_symmetric(name: str, me: int, n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """all_reduce, all_gather, reduce_scatter, all_to_all: (before, after) as N-slot rows."""
    if name == "all_reduce":
        buf = _row(me, n, k)
        before = buf.clone()
        dist.all_reduce(buf)
        return before, buf
    if name == "all_gather":
        mine = torch.full((k,), piece_value(me, me))
        pieces = [torch.empty(k) for _ in range(n)]
        dist.all_gather(pieces, mine)  # the list form: CommMeter counts it
        return _only(me, mine, n, k), torch.cat(pieces)
    if name == "reduce_scatter":
        buf = _row(me, n, k)
        out = torch.empty(k)
        dist.reduce_scatter(out, list(buf.clone().chunk(n)))  # piece r of the sum lands on rank r
        return buf, _only(me, out, n, k)
    if name == "all_to_all":
        buf = _row(me, n, k)
        out = torch.empty(n * k)
        dist.all_to_all_single(out, buf)  # slot c of rank r goes to rank c, slot r
        return buf, out
    raise ValueError(f"name = {name!r}: expected a primitive without a root")


def _run_primitive(
    name: str, rank: int, world_size: int, root: int, k: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run one torch.distributed primitive; return (input buffer, output buffer) as N-slot rows.

    An N-slot row shows what the rank holds in the buffer it passes in (before) and the buffer the
    result lands in (after); NaN marks a slot the rank has no data for. ``k``: float32 elements
    per slot (1 for the pictures; more to move enough bytes for the wire to be measured).
    """
    if name in ("broadcast", "scatter", "gather", "reduce"):
        return _run_rooted(name, rank, world_size, root, k)
    if name in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"):
        return _run_symmetric(name, rank, world_size, k)
    n, me = world_size, rank
    algorithm = name.removesuffix(" (from scratch)")
    buf = _row(me, n, k)
    before = buf.clone()
    C.ALL_REDUCE_ALGORITHMS[algorithm](buf)
    return before, buf


# --------------------------------------------------------------------------------------------
# what estimate predicts each rank sends in these runs
# --------------------------------------------------------------------------------------------
def payload_bytes(name: str, world_size: int, k: int = 1) -> int:
    """The S of a run_primitives run: N float32 slots of ``k`` elements, 4 * N * k bytes (the
    input row, or for all_gather and gather the output row, as estimate's conventions count it)."""
    validate.choice("name", name, COLLECTIVE_CHOICES)
    return 4 * world_size * k


def estimated_bytes_sent(
    name: str, world_size: int, rank: int, *, root: int = 0, k: int = 1
) -> int | float | None:
    """What estimate predicts ``rank`` sends in a run_primitives run of ``name`` with root
    ``root`` and ``k`` elements per slot (None when estimate has no formula for it). scatter and
    gather send different amounts at the root and elsewhere
    (``estimate.collective_bytes_sent(..., root=...)``); the from-scratch reduce + broadcast
    uses rank 0 as its root whatever ``root`` is."""
    size = payload_bytes(name, world_size, k)
    if name.endswith(" (from scratch)"):
        return predicted_bytes_sent(name.removesuffix(" (from scratch)"), size, world_size, rank)
    if name in estimate.COLLECTIVES:
        return estimate.collective_bytes_sent(name, size, world_size, root=rank == root)
    return None


def predicted_bytes_sent(
    algorithm: str, size_bytes: int, world_size: int, rank: int = 0
) -> int | float:
    """Bytes ``rank`` sends in ``algorithm`` on a tensor of ``size_bytes`` (from estimate)."""
    validate.choice("algorithm", algorithm, BYTE_EXPERIMENTS)
    if algorithm in estimate.ALLREDUCE_BYTES_ALGORITHMS:
        # reduce_broadcast_all_reduce's root is rank 0 (its default)
        return estimate.allreduce_bytes_sent(
            size_bytes, world_size, algorithm=algorithm, root=rank == 0
        )
    return estimate.reduce_scatter_bytes_sent(
        size_bytes, world_size
    ) + estimate.allgather_bytes_sent(size_bytes, world_size)
