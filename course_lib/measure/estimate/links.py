"""Time models for communication: alpha-beta, bus bandwidth, link speeds, two-level
all-reduce, and the part of DDP's gradient all-reduce that backward does not hide.

Introduced in notebooks/08_collectives.ipynb and notebooks/13_interconnects_and_backends.ipynb."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

from course_lib import validate as _v
from course_lib.measure.estimate.communication import COLLECTIVES, Collective

__all__ = [
    "alpha_beta_time",
    "AllreduceAlgorithm",
    "ALLREDUCE_ALGORITHMS",
    "allreduce_time",
    "fit_alpha_beta",
    "algbw",
    "busbw",
    "Link",
    "LINK_SPEEDS",
    "link_speed",
    "allreduce_time_on_link",
    "hierarchical_allreduce_breakdown",
    "hierarchical_allreduce_time",
    "ddp_exposed_comm_time",
]


# alpha-beta time models
def _beta(beta_s_per_byte: float | None, bandwidth: float | None) -> float:
    if (beta_s_per_byte is None) == (bandwidth is None):
        raise ValueError(
            f"beta_s_per_byte = {beta_s_per_byte!r}, bandwidth = {bandwidth!r}: expected exactly "
            "one of beta_s_per_byte (s/byte) or bandwidth (bytes/s)"
        )
    if bandwidth is not None:
        return 1.0 / _v.number("bandwidth", bandwidth, positive=True)
    return _v.number("beta_s_per_byte", beta_s_per_byte, minimum=0)


def alpha_beta_time(
    size_bytes: float,
    *,
    alpha_s: float = 0.0,
    beta_s_per_byte: float | None = None,
    bandwidth: float | None = None,
) -> float:
    """Hockney's model of one message: T = alpha + beta * S seconds (alpha: latency in s; beta:
    s/byte = 1/bandwidth in bytes/s; give beta_s_per_byte or bandwidth). Hockney 1994, "The
    communication challenge for MPP: Intel Paragon and Meiko CS-2", Parallel Computing 20(3)."""
    s = _v.number("size_bytes", size_bytes, minimum=0)
    return _v.number("alpha_s", alpha_s, minimum=0) + _beta(beta_s_per_byte, bandwidth) * s


AllreduceAlgorithm = Literal["ring", "tree", "recursive_doubling"]
ALLREDUCE_ALGORITHMS: tuple[AllreduceAlgorithm, ...] = ("ring", "tree", "recursive_doubling")


def allreduce_time(
    size_bytes: float,
    world_size: int,
    *,
    alpha: float = 0.0,
    bandwidth: float | None = None,
    beta: float | None = None,
    algorithm: AllreduceAlgorithm = "ring",
) -> float:
    """All-reduce time in seconds under the alpha-beta model (Thakur, Rabenseifner & Gropp 2005,
    "Optimization of collective communication operations in MPICH", IJHPCA 19(1); reduction
    compute ignored). p = world_size, n = size_bytes, beta = 1/bandwidth:

    * ``ring``: 2(p-1) alpha + 2(p-1)/p n beta (bandwidth-optimal, latency grows with p)
    * ``tree``: binary-tree reduce then broadcast, not pipelined: 2 ceil(log2 p) (alpha + n beta)
    * ``recursive_doubling``: ceil(log2 p) (alpha + n beta) (latency-optimal, for small messages)
    """
    n = _v.number("size_bytes", size_bytes, minimum=0)
    p = _v.count("world_size", world_size, minimum=1)
    a = _v.number("alpha", alpha, minimum=0)
    b = _beta(beta, bandwidth)
    algo = _v.choice("algorithm", algorithm, ALLREDUCE_ALGORITHMS, case_insensitive=True)
    if p == 1:
        return 0.0
    if algo == "ring":
        return 2 * (p - 1) * a + 2 * (p - 1) / p * n * b
    steps = math.ceil(math.log2(p))
    if algo == "tree":
        return 2 * steps * (a + n * b)
    return steps * (a + n * b)


def fit_alpha_beta(
    sizes: Sequence[float], times: Sequence[float], *, relative: bool = False
) -> tuple[float, float]:
    """Least-squares fit of T = alpha + beta * S to measured (size in bytes, time in s) pairs.

    Returns ``(alpha_s, beta_s_per_byte)``; 1/beta is the effective bandwidth in bytes/s. Needs at
    least two distinct sizes. Closed form.

    relative: ``False`` minimises the squared error in seconds (ordinary least squares), which the
        largest messages dominate: alpha, a few microseconds beside milliseconds, is then barely
        constrained and can even come out negative. ``True`` minimises the squared *relative*
        error, i.e. weights each point by 1/T^2, so small messages (which measure alpha) and large
        ones (which measure beta) count alike; the usual choice for latency-bandwidth fits
        (Hockney 1994, "The communication challenge for MPP", Parallel Computing 20(3)).
    """
    xs, ys = [float(s) for s in sizes], [float(t) for t in times]
    if len(xs) != len(ys):
        raise ValueError(f"times = {_v.describe(ys)}: expected one time per size ({len(xs)})")
    if len(set(xs)) < 2:
        raise ValueError(
            f"sizes = {_v.describe(xs)}: expected at least 2 distinct sizes to fit alpha and beta"
        )
    if relative and any(not y > 0 for y in ys):
        raise ValueError(f"times = {_v.describe(ys)}: expected every time > 0 with relative=True")
    ws = [1.0 / (y * y) for y in ys] if relative else [1.0] * len(ys)
    w = sum(ws)
    mx = sum(wi * x for wi, x in zip(ws, xs)) / w
    my = sum(wi * y for wi, y in zip(ws, ys)) / w
    sxx = sum(wi * (x - mx) ** 2 for wi, x in zip(ws, xs))
    sxy = sum(wi * (x - mx) * (y - my) for wi, x, y in zip(ws, xs, ys))
    beta = sxy / sxx
    return my - beta * mx, beta


def algbw(size_bytes: float, time_s: float) -> float:
    """nccl-tests "algorithm bandwidth": size / time in bytes/s (S is the buffer size per rank)."""
    return _v.number("size_bytes", size_bytes, minimum=0) / _v.number(
        "time_s", time_s, positive=True
    )


_BUSBW_FACTOR = {
    "all_reduce": lambda n: Fraction(2 * (n - 1), n),
    "all_gather": lambda n: Fraction(n - 1, n),
    "reduce_scatter": lambda n: Fraction(n - 1, n),
    "all_to_all": lambda n: Fraction(n - 1, n),
    "broadcast": lambda n: Fraction(1),
    "reduce": lambda n: Fraction(1),
    "send_recv": lambda n: Fraction(1),
    "scatter": lambda n: Fraction(n - 1, n),
    "gather": lambda n: Fraction(n - 1, n),
}


def busbw(algbw: float, collective: Collective, world_size: int) -> float:
    """nccl-tests "bus bandwidth" = algbw x factor, comparable to the link's peak bandwidth:
    all_reduce 2(n-1)/n, all_gather / reduce_scatter / all_to_all / scatter / gather (n-1)/n,
    broadcast / reduce / send_recv 1. https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md
    (scatter and gather: nccl-tests src/scatter.cu, src/gather.cu, ``ScatterGetBw``/``GatherGetBw``)."""
    c = _v.choice("collective", collective, COLLECTIVES, case_insensitive=True)
    n = _v.count("world_size", world_size, minimum=1)
    return float(_v.number("algbw", algbw, minimum=0) * _BUSBW_FACTOR[c](n))


# links
@dataclass(frozen=True)
class Link:
    """A published interconnect bandwidth.

    ``per_direction_GBps``: what one direction carries, in GB/s (1e9 bytes/s). A ring step sends
    to one neighbour while it receives from the other, so each direction carries its own bytes and
    this is the figure that bounds a collective: the course uses it everywhere.
    ``headline_GBps``: the figure as the vendor's headline quotes it, and ``headline_is`` which
    it is: "bidirectional" (both directions added, twice the per-direction figure: NVLink, and
    PCIe as PCI-SIG and NVIDIA quote it, e.g. the H100 PCIe data sheet's "PCIe Gen5 128 GB/s")
    or "per direction" (InfiniBand and Ethernet port speeds). Plugging a bidirectional headline
    into a ring formula makes every time 2x optimistic. ``source``: where the number comes from.
    ``alpha_us``: one ring step's latency (NVIDIA/nccl ``src/graph/tuning.cc``, ``hwLat``, ring
    / Simple protocol: NVLink 3.4, PCIe 5.7, network 9.6 us; a cost model's constant).
    """

    name: str
    headline_GBps: float
    per_direction_GBps: float
    kind: str  # "intra-node" or "inter-node"
    source: str
    note: str = ""
    headline_is: str = "per direction"  # or "bidirectional"

    @property
    def alpha_us(self) -> float:
        return 9.6 if self.kind == "inter-node" else 5.7 if "PCIe" in self.name else 3.4


LINK_SPEEDS: dict[str, Link] = {
    link.name: link
    for link in [
        Link(
            "PCIe 4.0 x16",
            64.0,
            32.0,
            "intra-node",
            "PCI-SIG PCIe 4.0 spec: 16 GT/s x 16 lanes, 128b/130b -> ~31.5 GB/s per direction; "
            "NVIDIA A100 PCIe data sheet: 'PCIe Gen4: 64 GB/s'",
            "64 GB/s is the bidirectional headline; ~32 GB/s per direction",
            "bidirectional",
        ),
        Link(
            "PCIe 5.0 x16",
            128.0,
            64.0,
            "intra-node",
            "PCI-SIG PCIe 5.0 spec: 32 GT/s x 16 lanes -> ~63 GB/s per direction; "
            "NVIDIA H100 data sheet: 'PCIe Gen5: 128 GB/s'",
            "128 GB/s is the bidirectional headline; ~64 GB/s per direction",
            "bidirectional",
        ),
        Link(
            "NVLink A100",
            600.0,
            300.0,
            "intra-node",
            "https://www.nvidia.com/en-us/data-center/a100/ (NVLink 3: 12 links, 600 GB/s total)",
            "600 GB/s is bidirectional aggregate; 300 GB/s per direction",
            "bidirectional",
        ),
        Link(
            "NVLink H100",
            900.0,
            450.0,
            "intra-node",
            "https://www.nvidia.com/en-us/data-center/h100/ (NVLink 4: 18 links, 900 GB/s total)",
            "900 GB/s is bidirectional aggregate; 450 GB/s per direction",
            "bidirectional",
        ),
        Link(
            "InfiniBand NDR",
            50.0,
            50.0,
            "inter-node",
            "https://www.nvidia.com/en-us/networking/infiniband-adapters/ (ConnectX-7, 400 Gb/s)",
            "400 Gb/s = 50 GB/s per port per direction",
        ),
        Link(
            "InfiniBand HDR",
            25.0,
            25.0,
            "inter-node",
            "https://www.nvidia.com/en-us/networking/infiniband-adapters/ (ConnectX-6, 200 Gb/s)",
            "200 Gb/s = 25 GB/s per port per direction",
        ),
        Link(
            "100 GbE",
            12.5,
            12.5,
            "inter-node",
            "IEEE 802.3 100 Gb/s Ethernet",
            "100 Gb/s = 12.5 GB/s per direction",
        ),
    ]
}


def link_speed(name: str) -> Link:
    """Look up a :data:`LINK_SPEEDS` entry by name (case-insensitive)."""
    by_name = {key.lower(): link for key, link in LINK_SPEEDS.items()}
    return by_name[_v.choice("name", name, by_name, case_insensitive=True)]


def allreduce_time_on_link(
    size_bytes: float, world_size: int, link_GBps: float, *, alpha: float = 0.0
) -> float:
    """Seconds for a ring all-reduce of ``size_bytes`` per rank over a link of ``link_GBps``
    (GB/s per direction, 1e9 bytes/s: ``Link.per_direction_GBps``): 2(N-1)/N * S / B
    (+ 2(N-1) alpha). Example: 2 GB of bf16 gradients (a 1B-parameter model) over 8 ranks:
    ~7.8 ms on NVLink H100 at its 450 GB/s per direction (the ~3.9 ms often quoted plugs in the
    900 GB/s bidirectional headline, 2x optimistic), ~70 ms at 50 GB/s (InfiniBand NDR).
    Introduced in notebooks/13_interconnects_and_backends.ipynb."""
    bw = _v.number("link_GBps", link_GBps, positive=True) * 1e9
    return allreduce_time(size_bytes, world_size, alpha=alpha, bandwidth=bw, algorithm="ring")


# two-level all-reduce, and DDP's overlap of buckets with backward
def hierarchical_allreduce_breakdown(
    size_bytes: float,
    *,
    nodes: int,
    gpus_per_node: int,
    intra_GBps: float,
    inter_GBps: float,
    alpha_intra: float = 0.0,
    alpha_inter: float = 0.0,
) -> dict[str, float]:
    """Alpha-beta estimate of a two-level (hierarchical) all-reduce, phase by phase, beside flat
    rings over every GPU. Seconds.

    Assumed machine: N = ``nodes`` nodes of G = ``gpus_per_node`` GPUs; inside a node every GPU
    reaches every other at ``intra_GBps`` per direction (NVSwitch); each GPU has its own NIC of
    ``inter_GBps`` (as on DGX-class nodes). Bandwidths in GB/s (1e9 B/s), alphas in seconds,
    ``size_bytes`` S the gradient each GPU holds.

    Hierarchical: reduce-scatter in the node, all-reduce across nodes, all-gather in the node --
    Horovod's ``HOROVOD_HIERARCHICAL_ALLREDUCE`` (horovod/common/ops/nccl_operations.cc,
    NCCLHierarchicalAllreduce: ncclReduceScatter, MPI_Allreduce, ncclAllGather) and the "2D"
    all-reduce of Mikami et al. 2018, arXiv:1811.05233 (Jia et al. 2018, arXiv:1807.11205, use
    reduce/broadcast in the node instead). Ring terms from Thakur, Rabenseifner & Gropp 2005,
    IJHPCA 19(1):

    1. ring reduce-scatter over the G GPUs of a node: (G-1) (alpha_intra + S/G / B_intra)
       (``reduce_scatter_intra_s``);
    2. all-reduce of each GPU's S/G shard with the same GPU of the other nodes, the G shards in
       parallel on their own NICs: :func:`allreduce_time` (S/G, N) on the inter-node link
       (``allreduce_inter_s``);
    3. ring all-gather in the node: the same as step 1 (``all_gather_intra_s``).

    ``hierarchical_s`` = 1 + 2 + 3. ``flat_rings_s``: G rings over all N*G GPUs side by side, one
    per NIC, each carrying S/G (what NCCL's ring algorithm does across nodes):
    :func:`allreduce_time` (S/G, N*G) on the inter-node link (every ring step crosses a node
    boundary somewhere, and the slowest hop sets its pace). Same bandwidth term to within the
    intra-node phases; the difference is latency: 2(N-1) inter-node steps instead of 2(NG-1).
    Introduced in notebooks/13_interconnects_and_backends.ipynb.
    """
    s = _v.number("size_bytes", size_bytes, minimum=0)
    n = _v.count("nodes", nodes, minimum=1)
    g = _v.count("gpus_per_node", gpus_per_node, minimum=1)
    b_intra = _v.number("intra_GBps", intra_GBps, positive=True) * 1e9
    b_inter = _v.number("inter_GBps", inter_GBps, positive=True) * 1e9
    # G-1 ring steps, each moving one S/G chunk over the intra-node link
    intra = (g - 1) * alpha_beta_time(s / g, alpha_s=alpha_intra, bandwidth=b_intra)
    inter = allreduce_time(s / g, n, alpha=alpha_inter, bandwidth=b_inter)
    flat = allreduce_time(s / g, n * g, alpha=alpha_inter, bandwidth=b_inter)
    return {
        "reduce_scatter_intra_s": intra,
        "allreduce_inter_s": inter,
        "all_gather_intra_s": intra,
        "hierarchical_s": 2 * intra + inter,
        "flat_rings_s": flat,
    }


def hierarchical_allreduce_time(
    size_bytes: float,
    *,
    nodes: int,
    gpus_per_node: int,
    intra_GBps: float,
    inter_GBps: float,
    alpha_intra: float = 0.0,
    alpha_inter: float = 0.0,
) -> float:
    """Seconds of a hierarchical all-reduce (intra-node ring reduce-scatter, inter-node
    all-reduce of the S/G shards, intra-node ring all-gather): 2 (G-1) (alpha_intra +
    S/G / B_intra) + 2(N-1) alpha_inter + 2(N-1)/N (S/G) / B_inter. Arguments, units and sources
    as in :func:`hierarchical_allreduce_breakdown`; with one node it is the ring all-reduce over
    the node's G GPUs."""
    return hierarchical_allreduce_breakdown(
        size_bytes,
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        intra_GBps=intra_GBps,
        inter_GBps=inter_GBps,
        alpha_intra=alpha_intra,
        alpha_inter=alpha_inter,
    )["hierarchical_s"]


def ddp_exposed_comm_time(
    bucket_bytes: int, *, grad_bytes: int, backward_s: float, alpha: float, beta: float
) -> float:
    """Seconds of gradient communication left after the backward pass ends, for one bucket size.

    The model of DDP's gradient bucketing (Li et al. 2020, "PyTorch Distributed: Experiences on
    Accelerating Data Parallel Training", VLDB, arXiv:2006.15704, Sec. 3.2: buckets are
    all-reduced as soon as they are full, overlapping the rest of backward) with Hockney's
    alpha-beta cost per call (:func:`alpha_beta_time`):

    * backward produces ``grad_bytes`` of gradient at a steady rate over ``backward_s`` seconds;
    * gradients are cut, in the order they are produced, into buckets of ``bucket_bytes`` (the
      last bucket holds what is left, so there are ceil(grad_bytes / bucket_bytes) buckets);
    * a bucket's all-reduce can start when its last byte is produced *and* the previous
      bucket's all-reduce has finished (one communication channel), and takes
      ``alpha + beta * bytes`` seconds (``alpha`` in s, ``beta`` in s/byte);
    * the answer is ``max(0, end of the last all-reduce - backward_s)``, in seconds.

    Small buckets pay alpha many times; large buckets leave a long last all-reduce that nothing
    overlaps. This is the trade-off ``bucket_cap_mb`` sets in DDP.
    Introduced in notebooks/13_interconnects_and_backends.ipynb.
    """
    b = _v.count("bucket_bytes", bucket_bytes, minimum=1)
    g = _v.count("grad_bytes", grad_bytes, minimum=1)
    backward_s = _v.number("backward_s", backward_s, minimum=0)
    alpha = _v.number("alpha", alpha, minimum=0)
    beta = _v.number("beta", beta, minimum=0)
    comm_free = 0.0  # when the channel finishes its previous all-reduce
    produced = 0
    while produced < g:
        size = min(b, g - produced)
        produced += size
        ready = backward_s * produced / g
        comm_free = max(ready, comm_free) + alpha + beta * size
    return max(0.0, comm_free - backward_s)
