"""Collectives from scratch, built only from point-to-point send/recv.

Introduced in notebooks/08_collectives.ipynb. Every function here has a torch.distributed twin that
the course checks it against (tests/parallel/test_collectives.py):

    ring_all_reduce              <->  dist.all_reduce(op=SUM)          bytes/rank 2(N-1)/N * S
    ring_reduce_scatter          <->  dist.reduce_scatter_single        bytes/rank  (N-1)/N * S
    ring_all_gather              <->  dist.all_gather_single            bytes/rank  (N-1)/N * S_out
    naive_ring_all_reduce        <->  dist.all_reduce                  bytes/rank  (N-1) * S
    reduce_broadcast_all_reduce  <->  dist.all_reduce                  bytes at the root (N-1) * S
    recursive_doubling_all_reduce <-> dist.all_reduce                  bytes/rank log2(N) * S
    rabenseifner_all_reduce      <->  dist.all_reduce                  bytes/rank 2(N-1)/N * S

(S is the size of the tensor in bytes, N the world size; the formulas live in
course_lib.measure.estimate.)

Chunking. The ring algorithms cut the flattened tensor into N chunks with ``torch.tensor_split``:
when the element count is not a multiple of N, the first ``numel % N`` chunks get one extra element
(``chunk_sizes(7, 4) == [2, 2, 2, 1]``), and some chunks may be empty (``chunk_sizes(1, 4) ==
[1, 0, 0, 0]``). The chunks are views of the tensor, so nothing is copied to cut it. With uneven
chunks a rank of ``ring_all_reduce`` sends ``2 * numel - size[r] - size[(r+1) % N]``
elements instead of exactly ``2 (N-1)/N * numel`` (``ring_all_reduce_elements_sent``).
``ring_reduce_scatter`` and ``ring_all_gather`` mirror torch.distributed and need the big tensor to
be exactly N times the small one.

Why isend/irecv. In a ring every rank sends to its right neighbour and receives from its left one
at the same time. With blocking ``send`` then ``recv`` every rank would sit in ``send`` waiting for
its neighbour to post the matching ``recv``, which it never reaches: a deadlock. (gloo's send
always waits for the matching receive; transports that buffer small messages, as many MPI
libraries do, only hide the bug until the messages grow.) Posting both halves with
``isend``/``irecv`` first and waiting afterwards lets every pair meet. Each ``wait`` is bounded by the process group's
timeout (set by ``course_lib.launch``).

Summation order. Each chunk is summed in ring order (a different starting rank per chunk), so the
result can differ from ``dist.all_reduce`` in the last bits of a float; every rank still ends with
bitwise-identical values, because every reduced chunk is computed once and then copied (the same
holds for reduce + broadcast and recursive doubling, not for the naive ring).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

__all__ = [
    "ALL_REDUCE_ALGORITHMS",
    "chunk_sizes",
    "naive_ring_all_reduce",
    "rabenseifner_all_reduce",
    "recursive_doubling_all_reduce",
    "reduce_broadcast_all_reduce",
    "ring_all_gather",
    "ring_all_reduce",
    "ring_all_reduce_elements_sent",
    "ring_reduce_scatter",
]


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------
def chunk_sizes(numel: int, world_size: int) -> list[int]:
    """Element count of each of the ``world_size`` ring chunks of a tensor with ``numel`` elements.

    Same split as ``torch.tensor_split(flat, world_size)``: the first ``numel % world_size``
    chunks hold one extra element.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got world_size={world_size}")
    if numel < 0:
        raise ValueError(f"numel must be >= 0, got numel={numel}")
    base, extra = divmod(numel, world_size)
    return [base + (1 if i < extra else 0) for i in range(world_size)]


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


def _check_tensor(name: str, tensor) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    if not tensor.dtype.is_floating_point:
        raise TypeError(
            f"{name} must have a floating-point dtype (float16, bfloat16, float32, float64), "
            f"got {name}.dtype={tensor.dtype}"
        )


def _world(group) -> tuple[int, int]:
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            "torch.distributed is not initialized: run this inside course_lib.launch(fn, world_size)"
        )
    return dist.get_rank(group), dist.get_world_size(group)


def _peer(group, group_rank: int) -> int:
    """Global rank of ``group_rank`` (isend/irecv address peers by global rank)."""
    return group_rank if group is None else dist.get_global_rank(group, group_rank)


def _exchange(send_buf: torch.Tensor, dst: int, recv_buf: torch.Tensor, src: int, group) -> None:
    """Send ``send_buf`` to ``dst`` while receiving ``recv_buf`` from ``src``.

    Both operations are posted before waiting on either: see the module docstring on deadlock.
    ``dist.isend`` is looked up at call time so that course_lib.measure.comm.CommMeter sees it.
    """
    # Post the receive first: some transports match a message faster when its receive is waiting.
    recv_req = dist.irecv(recv_buf, _peer(group, src), group=group)
    send_req = dist.isend(send_buf, _peer(group, dst), group=group)
    send_req.wait()
    recv_req.wait()


def _contiguous_flat(tensor: torch.Tensor) -> torch.Tensor:
    """A flat contiguous view of ``tensor`` (a copy only when ``tensor`` is not contiguous)."""
    return tensor.view(-1) if tensor.is_contiguous() else tensor.contiguous().view(-1)


def _snapshot(record, **info) -> None:
    if record is not None:
        info["state"] = info["state"].detach().clone()
        record.append(info)


# --------------------------------------------------------------------------------------------
# the two ring phases, on a list of chunk views (possibly uneven)
# --------------------------------------------------------------------------------------------
def _ring_reduce_scatter_chunks(
    chunks: list[torch.Tensor], rank: int, world: int, group, flat, record, phase_offset: int = 0
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
        _exchange(chunks[send_idx], right, incoming, left, group)
        chunks[recv_idx].add_(incoming)  # in place: the reduced chunk lives inside the tensor
        _snapshot(
            record,
            phase="reduce-scatter",
            step=phase_offset + step + 1,
            sent_chunk=send_idx,
            received_chunk=recv_idx,
            state=flat,
        )


def _ring_all_gather_chunks(
    chunks: list[torch.Tensor], rank: int, world: int, group, flat, record, phase_offset: int = 0
) -> None:
    """Rank r starts owning chunk r; after N-1 steps every rank holds every chunk.

    Step s: send chunk (r-s) % N to the right, receive chunk (r-s-1) % N from the left straight
    into its place in the tensor (chunks are contiguous views, so no staging copy).
    """
    right, left = (rank + 1) % world, (rank - 1) % world
    for step in range(world - 1):
        send_idx = (rank - step) % world
        recv_idx = (rank - step - 1) % world
        _exchange(chunks[send_idx], right, chunks[recv_idx], left, group)
        _snapshot(
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
    tensor: torch.Tensor, group=None, *, record: list | None = None
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
    _check_tensor("tensor", tensor)
    rank, world = _world(group)
    flat = _contiguous_flat(tensor)  # (S,)
    _snapshot(record, phase="input", step=0, sent_chunk=None, received_chunk=None, state=flat)
    if world == 1 or flat.numel() == 0:
        return tensor
    chunks = list(torch.tensor_split(flat, world))  # N views of sizes chunk_sizes(S, N)
    _ring_reduce_scatter_chunks(chunks, rank, world, group, flat, record)
    _ring_all_gather_chunks(chunks, rank, world, group, flat, record, phase_offset=world - 1)
    if not tensor.is_contiguous():  # we worked on a copy: write the result back
        tensor.copy_(flat.view_as(tensor))
    return tensor


def ring_reduce_scatter(
    output: torch.Tensor, input: torch.Tensor, group=None, *, record: list | None = None
) -> torch.Tensor:
    """Ring reduce-scatter, mirroring ``dist.reduce_scatter_single(output, input)`` (op SUM).

    ``input`` (any shape, N * k elements) is read as N consecutive chunks of k elements; rank r's
    ``output`` (k elements) receives the sum over ranks of chunk r. ``input`` is left untouched
    (the algorithm works on a copy). Bytes sent per rank: (N-1) * k * element_size.
    """
    _check_tensor("output", output)
    _check_tensor("input", input)
    rank, world = _world(group)
    if input.numel() != world * output.numel():
        raise ValueError(
            f"input must hold world_size * output.numel() elements: got input.numel()="
            f"{input.numel()}, output.numel()={output.numel()}, world_size={world} "
            f"(expected input.numel()={world * output.numel()})"
        )
    if input.dtype != output.dtype:
        raise TypeError(f"input and output dtypes differ: {input.dtype} vs {output.dtype}")
    if output.numel() == 0:
        return output
    work = input.detach().reshape(-1).clone()  # (N*k,) reduced in place; the caller's input stays
    chunks = list(work.chunk(world))  # N views of (k,)
    _snapshot(record, phase="input", step=0, sent_chunk=None, received_chunk=None, state=work)
    if world > 1:
        _ring_reduce_scatter_chunks(chunks, rank, world, group, work, record)
    output.copy_(chunks[rank].view_as(output))
    return output


def ring_all_gather(
    output: torch.Tensor, input: torch.Tensor, group=None, *, record: list | None = None
) -> torch.Tensor:
    """Ring all-gather, mirroring ``dist.all_gather_single(output, input)``.

    Rank r's ``input`` (k elements) lands in chunk r of every rank's ``output`` (N * k elements,
    any shape, contiguous). Bytes sent per rank: (N-1) * k * element_size.
    """
    _check_tensor("output", output)
    _check_tensor("input", input)
    rank, world = _world(group)
    if output.numel() != world * input.numel():
        raise ValueError(
            f"output must hold world_size * input.numel() elements: got output.numel()="
            f"{output.numel()}, input.numel()={input.numel()}, world_size={world} "
            f"(expected output.numel()={world * input.numel()})"
        )
    if input.dtype != output.dtype:
        raise TypeError(f"input and output dtypes differ: {input.dtype} vs {output.dtype}")
    if not output.is_contiguous():
        raise ValueError("output must be contiguous (its chunks are received into in place)")
    flat = output.view(-1)  # (N*k,)
    if flat.numel() == 0:
        return output
    chunks = list(flat.chunk(world))
    chunks[rank].copy_(input.reshape(-1))
    _snapshot(record, phase="input", step=0, sent_chunk=None, received_chunk=None, state=flat)
    if world > 1:
        _ring_all_gather_chunks(chunks, rank, world, group, flat, record)
    return output


def naive_ring_all_reduce(tensor: torch.Tensor, group=None) -> torch.Tensor:
    """All-reduce by passing whole tensors around the ring: N-1 steps of S bytes each.

    The obvious ring: at each step forward what you received last step and add it. Correct, but
    every rank sends (N-1) * S bytes, N/2 times more than ``ring_all_reduce``. In place, sum.
    Each rank adds the contributions in its own order (its left neighbour's first), so with
    random floats the ranks can disagree in the last bit: the chunked ring and the other
    algorithms here compute every sum once and copy it, so all ranks hold identical bits.
    """
    _check_tensor("tensor", tensor)
    rank, world = _world(group)
    flat = _contiguous_flat(tensor)  # (S,)
    if world == 1 or flat.numel() == 0:
        return tensor
    right, left = (rank + 1) % world, (rank - 1) % world
    outgoing = flat.clone()  # (S,) our own contribution travels first
    incoming = torch.empty_like(flat)
    for _ in range(world - 1):
        _exchange(outgoing, right, incoming, left, group)
        flat.add_(incoming)
        outgoing, incoming = incoming, outgoing  # forward what just arrived, reuse the other buffer
    if not tensor.is_contiguous():  # we worked on a copy: write the result back
        tensor.copy_(flat.view_as(tensor))
    return tensor


def reduce_broadcast_all_reduce(tensor: torch.Tensor, group=None, *, root: int = 0) -> torch.Tensor:
    """All-reduce as reduce-to-root then broadcast-from-root, with point-to-point messages.

    Every other rank sends its tensor to ``root`` (which adds them in rank order), then the root
    sends the sum back to each of them. The root sends (N-1) * S bytes and receives (N-1) * S: it is
    the bottleneck the ring removes. The other ranks send S each. In place, sum.
    """
    _check_tensor("tensor", tensor)
    rank, world = _world(group)
    if not 0 <= root < world:
        raise ValueError(f"root must be a rank in 0..{world - 1}, got root={root}")
    flat = _contiguous_flat(tensor)  # (S,)
    if world == 1 or flat.numel() == 0:
        return tensor
    if rank == root:
        incoming = [torch.empty_like(flat) for _ in range(world - 1)]
        peers = [r for r in range(world) if r != root]
        reqs = [dist.irecv(buf, _peer(group, r), group=group) for buf, r in zip(incoming, peers)]
        for req in reqs:
            req.wait()
        total = torch.zeros_like(flat)
        for r in range(world):  # rank order, so the result does not depend on arrival order
            total.add_(flat if r == root else incoming[peers.index(r)])
        flat.copy_(total)
        for req in [dist.isend(flat, _peer(group, r), group=group) for r in peers]:
            req.wait()
    else:
        dist.isend(flat, _peer(group, root), group=group).wait()
        dist.irecv(flat, _peer(group, root), group=group).wait()
    if not tensor.is_contiguous():  # we worked on a copy: write the result back
        tensor.copy_(flat.view_as(tensor))
    return tensor


def recursive_doubling_all_reduce(tensor: torch.Tensor, group=None) -> torch.Tensor:
    """Latency-optimised all-reduce: log2(N) pairwise exchanges of the whole tensor.

    Step k pairs rank r with r XOR 2^k; both send their partial sum and add what they receive.
    Only log2(N) message latencies (the ring pays 2(N-1)), but each rank sends log2(N) * S bytes
    (the ring: 2(N-1)/N * S), so it wins for small messages and loses for large ones
    (Thakur, Rabenseifner & Gropp, "Optimization of collective communication operations in
    MPICH", IJHPCA 2005). Needs a power-of-two world size. In place, sum.
    """
    _check_tensor("tensor", tensor)
    rank, world = _world(group)
    if world & (world - 1):
        valid = ", ".join(str(2**k) for k in range(6))
        raise ValueError(
            f"recursive_doubling_all_reduce needs a power-of-two world size, got world_size={world}; "
            f"valid choices: {valid}, ... (use ring_all_reduce for any world size)"
        )
    flat = _contiguous_flat(tensor)  # (S,)
    if world == 1 or flat.numel() == 0:
        return tensor
    incoming = torch.empty_like(flat)
    distance = 1
    while distance < world:
        partner = rank ^ distance
        _exchange(flat, partner, incoming, partner, group)
        # a + b == b + a exactly in IEEE arithmetic, so both partners hold identical sums
        flat.add_(incoming)
        distance *= 2
    if not tensor.is_contiguous():  # we worked on a copy: write the result back
        tensor.copy_(flat.view_as(tensor))
    return tensor


def rabenseifner_all_reduce(tensor: torch.Tensor, group=None) -> torch.Tensor:
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
    _check_tensor("tensor", tensor)
    rank, world = _world(group)
    if world & (world - 1):
        valid = ", ".join(str(2**k) for k in range(6))
        raise ValueError(
            f"rabenseifner_all_reduce needs a power-of-two world size, got world_size={world}; "
            f"valid choices: {valid}, ... (use ring_all_reduce for any world size)"
        )
    flat = _contiguous_flat(tensor)  # (S,)
    if world == 1 or flat.numel() == 0:
        return tensor
    offsets = [0]
    for size in chunk_sizes(flat.numel(), world):
        offsets.append(offsets[-1] + size)

    def span(lo: int, hi: int) -> torch.Tensor:  # chunks lo..hi-1, contiguous in flat
        return flat[offsets[lo] : offsets[hi]]

    lo, hi = 0, world  # the chunks this rank is still responsible for
    distance = world // 2
    while distance >= 1:  # reduce-scatter by recursive halving
        partner, mid = rank ^ distance, (lo + hi) // 2
        keep, give = ((lo, mid), (mid, hi)) if rank & distance == 0 else ((mid, hi), (lo, mid))
        incoming = torch.empty_like(span(*keep))
        _exchange(span(*give), partner, incoming, partner, group)
        span(*keep).add_(incoming)
        lo, hi = keep
        distance //= 2
    distance = 1
    while distance < world:  # all-gather by recursive doubling: swap, then hold twice as much
        partner = rank ^ distance
        other = (lo - (hi - lo), lo) if rank & distance else (hi, hi + (hi - lo))
        _exchange(span(lo, hi), partner, span(*other), partner, group)
        lo, hi = min(lo, other[0]), max(hi, other[1])
        distance *= 2
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
