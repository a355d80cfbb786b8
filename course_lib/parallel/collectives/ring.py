"""The ring collectives (all-reduce, reduce-scatter, all-gather) from send/recv, and the
table of every from-scratch all-reduce algorithm by name."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from course_lib.parallel.collectives.p2p import (
    check_same_dtype,
    check_tensor,
    chunk_sizes,
    collective_group,
    contiguous_flat,
    exchange,
    snapshot,
)
from course_lib.parallel.collectives.pairwise import (
    recursive_doubling_all_reduce,
    reduce_broadcast_all_reduce,
)
from course_lib.runtime.groups import Group

__all__ = [
    "ALL_REDUCE_ALGORITHMS",
    "naive_ring_all_reduce",
    "ring_all_gather",
    "ring_all_reduce",
    "ring_all_reduce_elements_sent",
    "ring_reduce_scatter",
]

#: ``record=[]`` collects one dict per step (the lecture draws the ring from it)
Record = list[dict[str, Any]] | None


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------
def ring_all_reduce_elements_sent(numel: int, world_size: int, rank: int) -> int:
    """Exact number of elements ``rank`` sends in ``ring_all_reduce`` (uneven chunks included).

    In the reduce-scatter phase rank r sends every chunk except chunk r, the one it ends up
    owning; in the all-gather phase every chunk except chunk (r+1) % N, the one it receives last.
    For ``numel`` divisible by N this is ``2 (N-1)/N * numel``.
    """
    if world_size == 1:
        return 0
    sizes = chunk_sizes(numel, world_size)
    return 2 * numel - sizes[rank % world_size] - sizes[(rank + 1) % world_size]


# --------------------------------------------------------------------------------------------
# the two ring phases, on a list of chunk views (possibly uneven)
# --------------------------------------------------------------------------------------------
def _ring_reduce_scatter_chunks(
    chunks: list[torch.Tensor],
    rank: int,
    world: int,
    group: Group,
    flat: torch.Tensor,
    record: Record,
    phase_offset: int = 0,
) -> None:
    """After N-1 steps, chunk ``rank`` holds the sum over all ranks of chunk ``rank``.

    Step s: send chunk (r-s-1) % N to the right neighbour, receive chunk (r-s-2) % N from the left
    neighbour and add it in place. What a rank sends at step s+1 is what it finished at step s.
    """
    right, left = (rank + 1) % world, (rank - 1) % world
    scratch = torch.empty(max(c.numel() for c in chunks), dtype=flat.dtype, device=flat.device)
    for step in range(world - 1):
        send_idx = (rank - step - 1) % world
        recv_idx = (rank - step - 2) % world
        incoming = scratch[: chunks[recv_idx].numel()]  # (chunk,) view, no allocation per step
        exchange(chunks[send_idx], right, incoming, left, group)
        chunks[recv_idx].add_(incoming)  # in place: the reduced chunk lives inside the tensor
        snapshot(
            record,
            phase="reduce-scatter",
            step=phase_offset + step + 1,
            sent_chunk=send_idx,
            received_chunk=recv_idx,
            state=flat,
        )


def _ring_all_gather_chunks(
    chunks: list[torch.Tensor],
    rank: int,
    world: int,
    group: Group,
    flat: torch.Tensor,
    record: Record,
    phase_offset: int = 0,
) -> None:
    """Rank r starts owning chunk r; after N-1 steps every rank holds every chunk.

    Step s: send chunk (r-s) % N to the right, receive chunk (r-s-1) % N from the left straight
    into its place in the tensor (chunks are contiguous views, so no staging copy).
    """
    right, left = (rank + 1) % world, (rank - 1) % world
    for step in range(world - 1):
        send_idx = (rank - step) % world
        recv_idx = (rank - step - 1) % world
        exchange(chunks[send_idx], right, chunks[recv_idx], left, group)
        snapshot(
            record,
            phase="all-gather",
            step=phase_offset + step + 1,
            sent_chunk=send_idx,
            received_chunk=recv_idx,
            state=flat,
        )


# --------------------------------------------------------------------------------------------
# public collectives
# --------------------------------------------------------------------------------------------
def ring_all_reduce(
    tensor: torch.Tensor, group: Group = None, *, record: Record = None
) -> torch.Tensor:
    """Sum ``tensor`` over all ranks, in place, with the bandwidth-optimal ring algorithm.

    Reduce-scatter (N-1 steps) then all-gather (N-1 steps), each step moving one chunk of about
    S/N bytes to the right neighbour: 2(N-1)/N * S bytes sent per rank, independent of N for large
    N (Patarasuk & Yuan, "Bandwidth optimal all-reduce algorithms for clusters of workstations",
    JPDC 2009). Works for any size (uneven chunks, see module docstring), any float dtype, and a
    single rank (nothing to do).

    Args:
        tensor: the local contribution; overwritten with the sum. Any shape; if it is not
            contiguous the algorithm works on a contiguous copy and copies the result back.
        group: process group (default: the world).
        record: if a list is given, one dict per step is appended: ``phase`` ("input",
            "reduce-scatter", "all-gather"), ``step`` (0 .. 2(N-1)), ``sent_chunk``,
            ``received_chunk`` and ``state`` (a flat copy of this rank's tensor after the step).
            Used by the notebook to draw the ring step by step from real data.

    Returns:
        ``tensor`` (the same object, now holding the sum).
    """
    check_tensor("tensor", tensor)
    rank, world, _, _ = collective_group(group)
    flat = contiguous_flat(tensor)  # (S,)
    snapshot(record, phase="input", step=0, sent_chunk=None, received_chunk=None, state=flat)
    if world == 1 or flat.numel() == 0:
        return tensor
    chunks = list(torch.tensor_split(flat, world))  # N views of sizes chunk_sizes(S, N)
    _ring_reduce_scatter_chunks(chunks, rank, world, group, flat, record)
    _ring_all_gather_chunks(chunks, rank, world, group, flat, record, phase_offset=world - 1)
    if not tensor.is_contiguous():  # we worked on a copy: write the result back
        tensor.copy_(flat.view_as(tensor))
    return tensor


def ring_reduce_scatter(
    output: torch.Tensor, input: torch.Tensor, group: Group = None, *, record: Record = None
) -> torch.Tensor:
    """Ring reduce-scatter, mirroring ``dist.reduce_scatter_single(output, input)`` (op SUM).

    ``input`` (any shape, N * k elements) is read as N consecutive chunks of k elements; rank r's
    ``output`` (k elements) receives the sum over ranks of chunk r. ``input`` is left untouched
    (the algorithm works on a copy). Bytes sent per rank: (N-1) * k * element_size.
    """
    check_tensor("output", output)
    check_tensor("input", input)
    rank, world, _, _ = collective_group(group)
    if input.numel() != world * output.numel():
        raise ValueError(
            f"input.numel() = {input.numel()}: expected world_size * output.numel() = "
            f"{world * output.numel()} (world_size={world}, output.numel()={output.numel()})"
        )
    check_same_dtype(input, output)
    if output.numel() == 0:
        return output
    work = input.detach().reshape(-1).clone()  # (N*k,) reduced in place; the caller's input stays
    chunks = list(work.chunk(world))  # N views of (k,)
    snapshot(record, phase="input", step=0, sent_chunk=None, received_chunk=None, state=work)
    if world > 1:
        _ring_reduce_scatter_chunks(chunks, rank, world, group, work, record)
    output.copy_(chunks[rank].view_as(output))
    return output


def ring_all_gather(
    output: torch.Tensor, input: torch.Tensor, group: Group = None, *, record: Record = None
) -> torch.Tensor:
    """Ring all-gather, mirroring ``dist.all_gather_single(output, input)``.

    Rank r's ``input`` (k elements) lands in chunk r of every rank's ``output`` (N * k elements,
    any shape, contiguous). Bytes sent per rank: (N-1) * k * element_size.
    """
    check_tensor("output", output)
    check_tensor("input", input)
    rank, world, _, _ = collective_group(group)
    if output.numel() != world * input.numel():
        raise ValueError(
            f"output.numel() = {output.numel()}: expected world_size * input.numel() = "
            f"{world * input.numel()} (world_size={world}, input.numel()={input.numel()})"
        )
    check_same_dtype(input, output)
    if not output.is_contiguous():
        raise ValueError(
            "output.is_contiguous() = False: expected a contiguous output "
            "(its chunks are received into in place)"
        )
    flat = output.view(-1)  # (N*k,)
    if flat.numel() == 0:
        return output
    chunks = list(flat.chunk(world))
    chunks[rank].copy_(input.reshape(-1))
    snapshot(record, phase="input", step=0, sent_chunk=None, received_chunk=None, state=flat)
    if world > 1:
        _ring_all_gather_chunks(chunks, rank, world, group, flat, record)
    return output


def naive_ring_all_reduce(tensor: torch.Tensor, group: Group = None) -> torch.Tensor:
    """All-reduce by passing whole tensors around the ring: N-1 steps of S bytes each.

    The obvious ring: at each step forward what you received last step and add it. Correct, but
    every rank sends (N-1) * S bytes, N/2 times more than ``ring_all_reduce``. In place, sum.
    Each rank adds the contributions in its own order (its left neighbour's first), so with
    random floats the ranks can disagree in the last bit: the chunked ring and the other
    algorithms here compute every sum once and copy it, so all ranks hold identical bits.
    """
    check_tensor("tensor", tensor)
    rank, world, _, _ = collective_group(group)
    flat = contiguous_flat(tensor)  # (S,)
    if world == 1 or flat.numel() == 0:
        return tensor
    right, left = (rank + 1) % world, (rank - 1) % world
    outgoing = flat.clone()  # (S,) our own contribution travels first
    incoming = torch.empty_like(flat)
    for _ in range(world - 1):
        exchange(outgoing, right, incoming, left, group)
        flat.add_(incoming)
        outgoing, incoming = incoming, outgoing  # forward what just arrived, reuse the other buffer
    if not tensor.is_contiguous():  # we worked on a copy: write the result back
        tensor.copy_(flat.view_as(tensor))
    return tensor


ALL_REDUCE_ALGORITHMS: dict[str, Callable[..., torch.Tensor]] = {
    "ring": ring_all_reduce,
    "naive_ring": naive_ring_all_reduce,
    "reduce_broadcast": reduce_broadcast_all_reduce,
    "recursive_doubling": recursive_doubling_all_reduce,
}
"""The from-scratch all-reduce algorithms by name (what the experiments and widgets sweep)."""
