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

from course_lib.parallel.collectives.p2p import chunk_sizes
from course_lib.parallel.collectives.pairwise import (
    rabenseifner_all_reduce,
    recursive_doubling_all_reduce,
    reduce_broadcast_all_reduce,
)
from course_lib.parallel.collectives.ring import (
    ALL_REDUCE_ALGORITHMS,
    naive_ring_all_reduce,
    ring_all_gather,
    ring_all_reduce,
    ring_all_reduce_elements_sent,
    ring_reduce_scatter,
)

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
