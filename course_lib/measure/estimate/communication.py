"""Communication volume: the bytes each rank sends in each collective and algorithm.

Introduced in notebooks/08_collectives.ipynb."""

from __future__ import annotations

from fractions import Fraction
from typing import Any, Literal

from course_lib import validate as _v
from course_lib.measure.estimate.units import exact

__all__ = [
    "Collective",
    "COLLECTIVES",
    "AllreduceBytesAlgorithm",
    "ring_allreduce_bytes_sent",
    "naive_ring_allreduce_bytes_sent",
    "reduce_broadcast_bytes_sent",
    "allgather_bytes_sent",
    "reduce_scatter_bytes_sent",
    "scatter_bytes_sent",
    "gather_bytes_sent",
    "recursive_doubling_allreduce_bytes_sent",
    "ALLREDUCE_BYTES_ALGORITHMS",
    "allreduce_bytes_sent",
    "collective_bytes_sent",
    "zero_bytes_sent_per_step",
]

# --------------------------------------------------------------------------------------------
# collectives: bytes each rank sends
# --------------------------------------------------------------------------------------------
#: collectives known to :func:`collective_bytes_sent` and :func:`busbw`
Collective = Literal[
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "broadcast",
    "reduce",
    "all_to_all",
    "send_recv",
    "scatter",
    "gather",
]
COLLECTIVES: tuple[Collective, ...] = (
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "broadcast",
    "reduce",
    "all_to_all",
    "send_recv",
    "scatter",
    "gather",
)


def ring_allreduce_bytes_sent(size_bytes: int, world_size: int) -> int | float:
    """Bytes each rank sends (and receives) in a ring all-reduce of ``size_bytes``:
    2(N-1)/N * S -- a reduce-scatter then an all-gather, each N-1 steps of S/N bytes.
    (Patarasuk & Yuan 2009, "Bandwidth optimal all-reduce algorithms for clusters of
    workstations"; https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md).
    int when N divides 2(N-1)S exactly, else float (real rings send whole elements; the
    float is the idealized figure). Introduced in notebooks/08_collectives.ipynb.
    """
    s, n = _v.count("size_bytes", size_bytes), _v.count("world_size", world_size, minimum=1)
    return exact(Fraction(2 * (n - 1) * s, n))


def naive_ring_allreduce_bytes_sent(size_bytes: int, world_size: int) -> int:
    """Bytes each rank sends in the naive ring all-reduce that passes the *whole* tensor around
    the ring N-1 times (reduce) -- (N-1) * S -- the baseline the chunked ring improves on."""
    s, n = _v.count("size_bytes", size_bytes), _v.count("world_size", world_size, minimum=1)
    return (n - 1) * s


def reduce_broadcast_bytes_sent(size_bytes: int, world_size: int, *, root: bool = True) -> int:
    """All-reduce as reduce-to-root then broadcast-from-root (the parameter-server pattern).

    The root receives (N-1)*S during the reduce and sends (N-1)*S during the broadcast: it is the
    bottleneck. ``root=True`` returns the root's bytes sent, (N-1)*S; ``root=False`` a non-root's,
    S (it sends its tensor once and receives the result once).
    """
    s, n = _v.count("size_bytes", size_bytes), _v.count("world_size", world_size, minimum=1)
    return (n - 1) * s if root else (s if n > 1 else 0)


def allgather_bytes_sent(size_bytes: int, world_size: int) -> int | float:
    """Bytes each rank sends in a ring all-gather whose *output* is ``size_bytes``: (N-1)/N * S
    (each rank forwards N-1 shards of S/N). int when exact, else float."""
    s, n = _v.count("size_bytes", size_bytes), _v.count("world_size", world_size, minimum=1)
    return exact(Fraction((n - 1) * s, n))


def reduce_scatter_bytes_sent(size_bytes: int, world_size: int) -> int | float:
    """Bytes each rank sends in a ring reduce-scatter whose *input* is ``size_bytes``:
    (N-1)/N * S. int when exact, else float."""
    s, n = _v.count("size_bytes", size_bytes), _v.count("world_size", world_size, minimum=1)
    return exact(Fraction((n - 1) * s, n))


def _root_flag(root: Any) -> bool:
    if not isinstance(root, bool):
        raise ValueError(
            f"root = {root!r}: expected one of True (the root rank's "
            "bytes), False (a non-root rank's bytes)"
        )
    return root


def scatter_bytes_sent(size_bytes: int, world_size: int, *, root: bool) -> int | float:
    """Bytes one rank sends in a scatter of the root's ``size_bytes`` buffer (N chunks of S/N,
    chunk r to rank r), sent directly by the root (gloo's and MPI's linear algorithm).

    ``root=True``: the root sends every other rank its chunk, (N-1)/N * S; ``root=False``: a
    non-root sends nothing, 0. The same convention as CommMeter (``course_lib.measure.comm``),
    which counts the root's ``(N-1) * chunk`` bytes and nothing elsewhere. int when exact, else
    float. (MPI 4.0 standard, Sec. 6.6, MPI_Scatter; Thakur et al. 2005, IJHPCA 19(1).)
    """
    s, n = _v.count("size_bytes", size_bytes), _v.count("world_size", world_size, minimum=1)
    return exact(Fraction((n - 1) * s, n)) if _root_flag(root) else 0


def gather_bytes_sent(size_bytes: int, world_size: int, *, root: bool) -> int | float:
    """Bytes one rank sends in a gather whose result at the root is ``size_bytes`` (N chunks of
    S/N, chunk r from rank r), each rank sending its chunk straight to the root.

    ``root=True``: the root sends nothing, 0 (its own chunk is a local copy; it *receives*
    (N-1)/N * S); ``root=False``: a non-root sends its chunk, S/N. The convention of CommMeter
    (``course_lib.measure.comm``). int when exact, else float. (MPI 4.0 standard, Sec. 6.5,
    MPI_Gather.)
    """
    s, n = _v.count("size_bytes", size_bytes), _v.count("world_size", world_size, minimum=1)
    if _root_flag(root) or n == 1:
        return 0
    return exact(Fraction(s, n))


def recursive_doubling_allreduce_bytes_sent(size_bytes: int, world_size: int) -> int:
    """Bytes each rank sends in a recursive-doubling all-reduce: log2(N) * S.

    log2(N) steps; in step k rank r swaps its whole partial sum (S bytes) with rank r XOR 2^k
    (Thakur, Rabenseifner & Gropp 2005, "Optimization of collective communication operations in
    MPICH", IJHPCA 19(1), Sec. 4). Every rank sends the same amount. ``world_size`` must be a
    power of two (1, 2, 4, 8, ...), as in ``course_lib.parallel.collectives``.
    Introduced in notebooks/08_collectives.ipynb.
    """
    s, n = _v.count("size_bytes", size_bytes), _v.count("world_size", world_size, minimum=1)
    if n & (n - 1):
        raise ValueError(
            f"world_size = {n}: expected a power of two (recursive doubling "
            "needs one): 1, 2, 4, 8, 16, ..."
        )
    return (n.bit_length() - 1) * s


#: all-reduce algorithms known to :func:`allreduce_bytes_sent` (the from-scratch ones of
#: ``course_lib.parallel.collectives``)
AllreduceBytesAlgorithm = Literal["ring", "naive_ring", "reduce_broadcast", "recursive_doubling"]
ALLREDUCE_BYTES_ALGORITHMS: tuple[AllreduceBytesAlgorithm, ...] = (
    "ring",
    "naive_ring",
    "reduce_broadcast",
    "recursive_doubling",
)


def allreduce_bytes_sent(
    size_bytes: int,
    world_size: int,
    *,
    algorithm: AllreduceBytesAlgorithm = "ring",
    root: bool = True,
) -> int | float:
    """Bytes one rank sends in an all-reduce of ``size_bytes`` with ``algorithm``:

    * ``ring``: 2(N-1)/N * S (:func:`ring_allreduce_bytes_sent`)
    * ``naive_ring``: (N-1) * S (:func:`naive_ring_allreduce_bytes_sent`)
    * ``reduce_broadcast``: (N-1) * S at the root, S elsewhere (``root`` says which;
      :func:`reduce_broadcast_bytes_sent`)
    * ``recursive_doubling``: log2(N) * S, N a power of two
      (:func:`recursive_doubling_allreduce_bytes_sent`)

    ``root`` only matters for ``reduce_broadcast``. int when exact, else float.
    """
    algo = _v.choice("algorithm", algorithm, ALLREDUCE_BYTES_ALGORITHMS, case_insensitive=True)
    if algo == "ring":
        return ring_allreduce_bytes_sent(size_bytes, world_size)
    if algo == "naive_ring":
        return naive_ring_allreduce_bytes_sent(size_bytes, world_size)
    if algo == "reduce_broadcast":
        return reduce_broadcast_bytes_sent(size_bytes, world_size, root=_root_flag(root))
    return recursive_doubling_allreduce_bytes_sent(size_bytes, world_size)


def collective_bytes_sent(
    collective: Collective, size_bytes: int, world_size: int, *, root: bool | None = None
) -> int | float:
    """Bytes one rank sends for ``collective`` on a payload of ``size_bytes`` with the
    bandwidth-optimal ring/pipeline algorithms (the convention CommMeter reports): all_reduce
    2(N-1)/N S; all_gather (S = output) and reduce_scatter (S = input) (N-1)/N S; all_to_all
    (N-1)/N S (the part addressed to other ranks); broadcast/reduce (N-1)/N S (a pipelined
    ring: N-1 of the N ranks forward the whole payload once -- averaged over ranks); send_recv S.

    scatter (S = the root's input) and gather (S = the root's output) are direct exchanges
    whose bytes differ between the root and the other ranks, so they need ``root``: True for
    the root, False for any other rank. scatter: root (N-1)/N S, others 0; gather: root 0,
    others S/N (:func:`scatter_bytes_sent`, :func:`gather_bytes_sent`). ``root`` is ignored
    for the other collectives, whose figure is the same on every rank.
    int when exact, else float.
    """
    c = _v.choice("collective", collective, COLLECTIVES, case_insensitive=True)
    s, n = _v.count("size_bytes", size_bytes), _v.count("world_size", world_size, minimum=1)
    if c in ("scatter", "gather"):
        if root is None:
            raise ValueError(
                f"root = None: expected True (the root rank's bytes) or False (a "
                f"non-root rank's bytes) for collective {c!r}, where the root and the "
                "other ranks send different amounts"
            )
        fn = scatter_bytes_sent if c == "scatter" else gather_bytes_sent
        return fn(s, n, root=root)
    one = {
        "all_reduce": ring_allreduce_bytes_sent,
        "all_gather": allgather_bytes_sent,
        "reduce_scatter": reduce_scatter_bytes_sent,
    }
    if c in one:
        return one[c](s, n)
    if c == "send_recv":
        return s
    return exact(Fraction((n - 1) * s, n))  # all_to_all, broadcast, reduce


def zero_bytes_sent_per_step(
    size_bytes: int,
    world_size: int,
    *,
    stage: int,
    reshard_after_forward: bool = True,
    micro_batches: int = 1,
) -> int | float:
    """Bytes each rank sends in one training step under ZeRO stage 0-3 with ring collectives,
    for a model whose parameters (and gradients) take ``size_bytes`` (S; under our padded
    layout, the padded size), with ``micro_batches`` (K) accumulated per optimizer step:

    * stage 0 (DDP, ``no_sync`` on all but the last micro-batch): one all-reduce of the
      gradients, 2(N-1)/N S whatever K;
    * stage 1: the full gradients accumulate locally, then one reduce-scatter and one
      all-gather of the updated parameters, (N-1)/N S each: 2(N-1)/N S, DDP's total whatever K;
    * stage 2: each rank keeps only its gradient shard, so every micro-batch's gradients are
      reduce-scattered, plus one all-gather: (K+1)(N-1)/N S; at K = 1 the same as DDP (ZeRO
      paper, arXiv:1910.02054, Sec. 7.2.1);
    * stage 3: every micro-batch all-gathers the parameters before forward and again before
      backward and reduce-scatters the gradients: 3K(N-1)/N S, 1.5x DDP at K = 1 (Sec. 7.2.2).
      With ``reshard_after_forward=False`` the gathered parameters survive until backward:
      2K(N-1)/N S, at the memory cost of holding them.

    int when exact, else float. Introduced in notebooks/10_zero_fsdp.ipynb.
    """
    s, n = _v.count("size_bytes", size_bytes), _v.count("world_size", world_size, minimum=1)
    stage = _v.choice("stage", _v.count("stage", stage), (0, 1, 2, 3))
    k = _v.count("micro_batches", micro_batches, minimum=1)
    if not isinstance(reshard_after_forward, bool):
        raise ValueError(
            f"reshard_after_forward = {reshard_after_forward!r}: expected one of True, False"
        )
    if stage == 3:
        passes = (3 if reshard_after_forward else 2) * k
    elif stage == 2:
        passes = k + 1
    else:
        passes = 2
    return exact(Fraction(passes * (n - 1) * s, n))
