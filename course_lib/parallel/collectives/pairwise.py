"""All-reduce without the ring, from point-to-point messages: through a root, by recursive
doubling, and Rabenseifner's halving-then-doubling. Introduced in notebooks/08_collectives.ipynb,
beside the ring algorithms of ``ring.py`` (the package front re-exports both)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from course_lib import validate
from course_lib.parallel.collectives.p2p import (
    check_tensor,
    chunk_sizes,
    collective_group,
    contiguous_flat,
    exchange,
    wait,
)
from course_lib.runtime.groups import Group, global_rank

__all__ = [
    "reduce_broadcast_all_reduce",
    "recursive_doubling_all_reduce",
    "rabenseifner_all_reduce",
]


def reduce_broadcast_all_reduce(
    tensor: torch.Tensor, group: Group = None, *, root: int = 0
) -> torch.Tensor:
    """All-reduce as reduce-to-root then broadcast-from-root, with point-to-point messages.

    Every other rank sends its tensor to ``root`` (which adds them in rank order), then the root
    sends the sum back to each of them. The root sends (N-1) * S bytes and receives (N-1) * S: it is
    the bottleneck the ring removes. The other ranks send S each. In place, sum.
    """
    check_tensor("tensor", tensor)
    rank, world, _, _ = collective_group(group)
    root = validate.count("root", root, minimum=0, maximum=world - 1)
    flat = contiguous_flat(tensor)  # (S,)
    if world == 1 or flat.numel() == 0:
        return tensor
    if rank == root:
        incoming = [torch.empty_like(flat) for _ in range(world - 1)]
        peers = [r for r in range(world) if r != root]
        wait(*[dist.irecv(b, global_rank(group, r), group=group) for b, r in zip(incoming, peers)])
        total = torch.zeros_like(flat)
        for r in range(world):  # rank order, so the result does not depend on arrival order
            total.add_(flat if r == root else incoming[peers.index(r)])
        flat.copy_(total)
        wait(*[dist.isend(flat, global_rank(group, r), group=group) for r in peers])
    else:
        wait(dist.isend(flat, global_rank(group, root), group=group))
        wait(dist.irecv(flat, global_rank(group, root), group=group))
    if not tensor.is_contiguous():  # we worked on a copy: write the result back
        tensor.copy_(flat.view_as(tensor))
    return tensor


def recursive_doubling_all_reduce(tensor: torch.Tensor, group: Group = None) -> torch.Tensor:
    """Latency-optimised all-reduce: log2(N) pairwise exchanges of the whole tensor.

    Step k pairs rank r with r XOR 2^k; both send their partial sum and add what they receive.
    Only log2(N) message latencies (the ring pays 2(N-1)), but each rank sends log2(N) * S bytes
    (the ring: 2(N-1)/N * S), so it wins for small messages and loses for large ones
    (Thakur, Rabenseifner & Gropp, "Optimization of collective communication operations in
    MPICH", IJHPCA 2005). Needs a power-of-two world size. In place, sum.
    """
    check_tensor("tensor", tensor)
    rank, world, _, _ = collective_group(group)
    validate.power_of_two(
        "world_size",
        world,
        note="recursive_doubling_all_reduce pairs ranks by bits; use ring_all_reduce for any world size",
    )
    flat = contiguous_flat(tensor)  # (S,)
    if world == 1 or flat.numel() == 0:
        return tensor
    incoming = torch.empty_like(flat)
    distance = 1
    while distance < world:
        partner = rank ^ distance
        exchange(flat, partner, incoming, partner, group)
        # a + b == b + a exactly in IEEE arithmetic, so both partners hold identical sums
        flat.add_(incoming)
        distance *= 2
    if not tensor.is_contiguous():  # we worked on a copy: write the result back
        tensor.copy_(flat.view_as(tensor))
    return tensor


def rabenseifner_all_reduce(tensor: torch.Tensor, group: Group = None) -> torch.Tensor:
    """Rabenseifner's all-reduce: reduce-scatter by recursive halving, then all-gather by
    recursive doubling.

    Reduce-scatter: at step k (distance N/2, N/4, ..., 1) rank r pairs with r XOR distance; the
    two split the chunks they still share in halves, each sends the half the other keeps and adds
    the half it receives. After log2 N steps rank r holds the complete sum of chunk r. All-gather:
    the same pairs in reverse order (distance 1, 2, ..., N/2) swap what they hold, doubling it.
    The ring's bytes (2(N-1)/N * S per rank, for sizes N divides) in 2 log2 N steps instead of
    2(N-1): bandwidth-optimal like the ring, nearly as few latencies as recursive doubling
    (Rabenseifner 2004, "Optimization of collective reduction operations", ICCS; Thakur,
    Rabenseifner & Gropp 2005, IJHPCA 19(1)). Needs a power-of-two world size. In place, sum.
    Chunks are cut as in the ring (``torch.tensor_split``).
    """
    check_tensor("tensor", tensor)
    rank, world, _, _ = collective_group(group)
    validate.power_of_two(
        "world_size",
        world,
        note="rabenseifner_all_reduce pairs ranks by bits; use ring_all_reduce for any world size",
    )
    flat = contiguous_flat(tensor)  # (S,)
    if world == 1 or flat.numel() == 0:
        return tensor
    offsets = [0]
    for size in chunk_sizes(flat.numel(), world):
        offsets.append(offsets[-1] + size)
    lo, hi = _halving_reduce_scatter(flat, offsets, rank, world, group)
    _doubling_all_gather(flat, offsets, (lo, hi), rank, world, group)
    if not tensor.is_contiguous():  # we worked on a copy: write the result back
        tensor.copy_(flat.view_as(tensor))
    return tensor


def _halving_reduce_scatter(
    flat: torch.Tensor, offsets: list[int], rank: int, world: int, group: Group
) -> tuple[int, int]:
    """Rabenseifner's first half: at distance N/2, N/4, ..., 1 rank r and r XOR distance split
    the chunks they still share; each sends the half the other keeps and adds the half it
    receives. Returns the chunks (lo, hi) this rank ends up owning, summed: (r, r+1)."""

    def span(lo: int, hi: int) -> torch.Tensor:  # chunks lo..hi-1, contiguous in flat
        return flat[offsets[lo] : offsets[hi]]

    lo, hi = 0, world  # the chunks this rank is still responsible for
    distance = world // 2
    while distance >= 1:
        partner, mid = rank ^ distance, (lo + hi) // 2
        keep, give = ((lo, mid), (mid, hi)) if rank & distance == 0 else ((mid, hi), (lo, mid))
        incoming = torch.empty_like(span(*keep))
        exchange(span(*give), partner, incoming, partner, group)
        span(*keep).add_(incoming)
        lo, hi = keep
        distance //= 2
    return lo, hi


def _doubling_all_gather(
    flat: torch.Tensor,
    offsets: list[int],
    held: tuple[int, int],
    rank: int,
    world: int,
    group: Group,
) -> None:
    """Rabenseifner's second half: the same pairs in reverse order (distance 1, 2, ..., N/2)
    swap the chunks they hold, each then holding twice as many."""

    def span(lo: int, hi: int) -> torch.Tensor:  # chunks lo..hi-1, contiguous in flat
        return flat[offsets[lo] : offsets[hi]]

    (lo, hi), distance = held, 1
    while distance < world:
        partner = rank ^ distance
        other = (lo - (hi - lo), lo) if rank & distance else (hi, hi + (hi - lo))
        exchange(span(lo, hi), partner, span(*other), partner, group)
        lo, hi = min(lo, other[0]), max(hi, other[1])
        distance *= 2
