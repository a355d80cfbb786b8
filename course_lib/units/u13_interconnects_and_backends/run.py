"""Interconnects and communication backends, measured.

Introduced in notebooks/13_interconnects_and_backends.ipynb. What this module measures or
predicts, each returned as plain data (dicts, tidy pandas DataFrames); plots live in
``course_lib.units.u13_interconnects_and_backends.plots``:

- :func:`backend_report`: which torch.distributed backends this build has (gloo, NCCL) and GPUs;
- :func:`memcpy_bandwidth`: one thread copying memory, the ceiling for ranks on one host;
- :func:`collective_sweep`: all-reduce / all-gather / reduce-scatter timed over message sizes and
  world sizes on real ranks, reported in the nccl-tests convention (algbw, busbw);
- :func:`fit_sweep` / :func:`sweep_residuals`: the alpha-beta model fitted to that sweep;
- :func:`heldout_fit`: the same fit made on some sizes and judged on the sizes it never saw;
- :func:`placement_table`: tensor, pipeline and data parallelism's traffic per step on NVLink
  and on InfiniBand (why TP stays in a node and PP/DP cross nodes);
- :func:`link_table` / :func:`gradient_allreduce_table`: published link speeds turned into
  predicted gradient all-reduce times (formulas in ``course_lib.measure.estimate``);
- ``estimate.hierarchical_allreduce_breakdown``: intra-node + inter-node all-reduce, same model
  (``estimate.hierarchical_allreduce_breakdown``);
- :func:`topology_report`: ``nvidia-smi topo -m`` when there is one.

DDP's buckets, measured, are unit 09's (``course_lib.measure.bucket_sweep``).

Conventions (nccl-tests, https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md):
``size_bytes`` is the full buffer: the all-reduce tensor, the all-gather *output*, the
reduce-scatter *input*. ``algbw = size / time`` and ``busbw = algbw x 2(n-1)/n`` for all-reduce,
``x (n-1)/n`` for all-gather and reduce-scatter; GB/s means 1e9 bytes per second.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd
import torch
import torch.distributed as dist

from course_lib import kit, validate
from course_lib.measure import estimate
from course_lib.units.u13_interconnects_and_backends.run_sweep import (
    SWEEP_COLLECTIVES,
    SweepConfig,
    collective_sweep,
    fit_sweep,
    heldout_fit,
    sweep_residuals,
    sweep_sizes,
)

__all__ = [
    "SWEEP_COLLECTIVES",
    "SweepConfig",
    "backend_report",
    "memcpy_bandwidth",
    "sweep_sizes",
    "collective_sweep",
    "fit_sweep",
    "sweep_residuals",
    "heldout_fit",
    "placement_table",
    "link_table",
    "gradient_allreduce_table",
    "topology_report",
]


@dataclass(frozen=True)
class PlacementRow:
    """:func:`placement_table`: one parallelism's traffic per step on NVLink and InfiniBand."""

    parallelism: str
    calls_per_step: int
    bytes_per_call: int
    nvlink_s: float
    infiniband_s: float
    overlaps_compute: bool


@dataclass(frozen=True)
class LinkRow:
    """:func:`link_table`: one published link speed."""

    link: str
    kind: str
    per_direction_GBps: float
    headline_GBps: float
    headline_is: str
    note: str
    source: str


@dataclass(frozen=True)
class GradientRow:
    """:func:`gradient_allreduce_table`: one model's gradient all-reduce on one link."""

    n_params: int
    grad_bytes: int
    link: str
    per_direction_GBps: float
    time_s: float
    time_headline_s: float
    headline_is: str


# --------------------------------------------------------------------------------------------
# what this machine has
# --------------------------------------------------------------------------------------------
def backend_report() -> dict:
    """Which communication backends and devices a run here can use.

    Keys: ``gloo``, ``nccl`` (``torch.distributed.is_*_available()``), ``cuda_devices``
    (``torch.cuda.device_count()``), ``multi_rank_backend`` (what ``course_lib.launch`` picks for 2
    ranks: NCCL only with one GPU per rank), ``both_on_gpus`` (True where the sweep can run on both
    gloo and NCCL: NCCL available and at least 2 GPUs).
    """
    from course_lib.runtime.device import resolve_backend

    n_gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    nccl = dist.is_available() and dist.is_nccl_available()
    return {
        "gloo": dist.is_available() and dist.is_gloo_available(),
        "nccl": nccl,
        "cuda_devices": n_gpus,
        "multi_rank_backend": resolve_backend("auto", 2),
        "both_on_gpus": bool(nccl and n_gpus >= 2),
    }


def memcpy_bandwidth(
    size_bytes: int = 64 * estimate.MiB, *, warmup: int = 1, repeat: int = 5
) -> dict:
    """Single-thread memory-copy bandwidth of this host: the ceiling for ranks on one host.

    Two processes on one machine exchange data through memory (gloo: TCP over loopback, i.e. the
    kernel copies every byte at least twice), so no collective between them can move bytes faster
    than one core copies them. Copies ``size_bytes`` with ``dst.copy_(src)`` on one intra-op thread
    and returns ``{"size_bytes", "time_s" (median), "time_min_s", "time_max_s", "GBps"}`` where
    GBps = bytes copied / median time / 1e9 (the memory traffic is twice that: read + write).
    """
    size = validate.count("size_bytes", size_bytes, minimum=1)
    warmup = validate.count("warmup", warmup, minimum=0)
    repeat = validate.count("repeat", repeat, minimum=1)
    from course_lib.measure.timing import time_fn

    n = max(1, size // 4)
    src = torch.ones(n, dtype=torch.float32)
    dst = torch.empty_like(src)
    with kit.one_thread():  # one thread, as each gloo rank's transport copies with one
        r = time_fn(lambda: dst.copy_(src), warmup=warmup, repeat=repeat, sync=False)
    return {
        "size_bytes": 4 * n,
        "time_s": r.median_s,
        "time_min_s": r.min_s,
        "time_max_s": r.max_s,
        "GBps": 4 * n / r.median_s / 1e9,
    }


def placement_table(
    n_params: float = 7e9,
    *,
    hidden: int = 4096,
    layers: int = 32,
    tokens: int = 4096,
    group: int = 8,
    dtype: str = "bf16",
) -> pd.DataFrame:
    """The communication of one training step of each parallelism, on NVLink H100 and on one
    400 Gb/s InfiniBand NDR port (per-direction figures; bandwidth terms only).

    A transformer of ``n_params`` parameters, ``layers`` layers of width ``hidden``; one step
    processes ``tokens`` tokens per model replica; each parallel group has ``group`` ranks.

    * tensor parallelism (Megatron-LM, Shoeybi et al. 2019): 2 all-reduces of the activations
      (tokens x hidden) per layer in forward and 2 in backward, on the critical path;
    * pipeline parallelism: one point-to-point send of the activations per stage boundary forward
      and one of their gradients backward (counted for one boundary);
    * data parallelism: one all-reduce of the gradients (n_params) per step, which can run while
      backward is still computing earlier layers.

    Columns: parallelism, calls_per_step, bytes_per_call, nvlink_s, infiniband_s, overlaps_compute.
    Introduced in notebooks/13_interconnects_and_backends.ipynb (the placement rule).
    """
    width = estimate.dtype_bytes(dtype)
    activ = (
        validate.count("tokens", tokens, minimum=1)
        * validate.count("hidden", hidden, minimum=1)
        * width
    )
    layers = validate.count("layers", layers, minimum=1)
    group = validate.count("group", group, minimum=2)
    grads = validate.count("n_params", int(n_params), minimum=1) * width
    nv = estimate.link_speed("NVLink H100").per_direction_GBps
    ib = estimate.link_speed("InfiniBand NDR").per_direction_GBps

    def per_step(calls: int, size: int, collective: bool, gbps: float) -> float:
        one = (
            estimate.allreduce_time_on_link(size, group, gbps)
            if collective
            else size / (gbps * 1e9)
        )
        return calls * one

    rows = [
        ("tensor (all-reduce of activations)", 4 * layers, activ, True, False),
        ("pipeline (send activations, one boundary)", 2, activ, False, False),
        ("data (all-reduce of gradients)", 1, grads, True, True),
    ]
    out = [
        PlacementRow(name, calls, size, per_step(calls, size, collective, nv),
                     per_step(calls, size, collective, ib), overlaps)
        for name, calls, size, collective, overlaps in rows
    ]  # fmt: skip
    return kit.frame(out, PlacementRow)


# --------------------------------------------------------------------------------------------
# published links -> predicted times
# --------------------------------------------------------------------------------------------
def link_table() -> pd.DataFrame:
    """estimate.LINK_SPEEDS as one table: name, kind, per_direction_GBps (what the course uses),
    headline_GBps (as the vendor quotes it), headline_is ("bidirectional": both directions
    added, or "per direction"), note, source."""
    return kit.frame(
        [LinkRow(k.name, k.kind, k.per_direction_GBps, k.headline_GBps, k.headline_is, k.note,
                 k.source) for k in estimate.LINK_SPEEDS.values()],
        LinkRow,
    )  # fmt: skip


def gradient_allreduce_table(
    n_params: Sequence[float] = (1e9, 7e9), *, dtype: str = "bf16", world_size: int = 8
) -> pd.DataFrame:
    """Predicted ring all-reduce time of one step's gradients on every link of LINK_SPEEDS.

    One row per (model, link): n_params, grad_bytes (n_params x dtype bytes), link,
    per_direction_GBps, time_s at the per-direction figure (the course's convention) and
    time_headline_s at the vendor's headline figure (estimate.allreduce_time_on_link, no latency
    term), headline_is (which that headline is: "bidirectional" or "per direction"). E.g. 1e9 bf16 gradients = 2 GB over 8 ranks: ~7.8 ms on NVLink H100 (450 GB/s per
    direction; ~3.9 ms with its 900 GB/s headline), ~70 ms at 50 GB/s.
    """
    width = estimate.dtype_bytes(dtype)
    rows = []
    for n in n_params:
        if isinstance(n, float) and n.is_integer():
            n = int(n)  # papers write 7e9
        grad_bytes = validate.count("n_params", n, minimum=1) * width
        for link in estimate.LINK_SPEEDS.values():
            t, t_headline = (
                estimate.allreduce_time_on_link(grad_bytes, world_size, gbps)
                for gbps in (link.per_direction_GBps, link.headline_GBps)
            )
            row = (int(n), grad_bytes, link.name, link.per_direction_GBps, t, t_headline)
            rows.append(GradientRow(*row, link.headline_is))
    return kit.frame(rows, GradientRow)


# --------------------------------------------------------------------------------------------
# topology
# --------------------------------------------------------------------------------------------
#: An example in the format ``nvidia-smi topo -m`` prints, for an 8-GPU node whose GPUs all reach
#: each other through NVSwitch (18 bonded NVLinks each, as on an H100 SXM node) and one NIC per
#: GPU pair; the legend is the one nvidia-smi prints. Shown, labelled as an example, where no
#: nvidia-smi exists.
TOPO_EXAMPLE = """\
        GPU0  GPU1  GPU2  GPU3  GPU4  GPU5  GPU6  GPU7  NIC0  NIC1  NIC2  NIC3  CPU Affinity  NUMA Affinity
GPU0     X    NV18  NV18  NV18  NV18  NV18  NV18  NV18  PXB   NODE  SYS   SYS   0-55          0
GPU1    NV18   X    NV18  NV18  NV18  NV18  NV18  NV18  PXB   NODE  SYS   SYS   0-55          0
GPU2    NV18  NV18   X    NV18  NV18  NV18  NV18  NV18  NODE  PXB   SYS   SYS   0-55          0
GPU3    NV18  NV18  NV18   X    NV18  NV18  NV18  NV18  NODE  PXB   SYS   SYS   0-55          0
GPU4    NV18  NV18  NV18  NV18   X    NV18  NV18  NV18  SYS   SYS   PXB   NODE  56-111        1
GPU5    NV18  NV18  NV18  NV18  NV18   X    NV18  NV18  SYS   SYS   PXB   NODE  56-111        1
GPU6    NV18  NV18  NV18  NV18  NV18  NV18   X    NV18  SYS   SYS   NODE  PXB   56-111        1
GPU7    NV18  NV18  NV18  NV18  NV18  NV18  NV18   X    SYS   SYS   NODE  PXB   56-111        1

Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks
"""


def topology_report(*, timeout: float = 10.0) -> dict:
    """``nvidia-smi topo -m`` of this machine when nvidia-smi exists and answers, else the
    labelled :data:`TOPO_EXAMPLE`. Returns ``{"measured": bool, "source": str, "text": str}``."""
    exe = shutil.which("nvidia-smi")
    if exe is not None:
        try:
            out = subprocess.run(
                [exe, "topo", "-m"],
                capture_output=True,
                text=True,
                timeout=validate.number("timeout", timeout, positive=True),
                check=False,
            )
            if out.returncode == 0 and out.stdout.strip():
                return {"measured": True, "source": f"{exe} topo -m", "text": out.stdout}
            first = (out.stderr or out.stdout).strip().splitlines()[:1] or ["no output"]
            reason = f"nvidia-smi topo -m failed ({first[0]})"
        except subprocess.TimeoutExpired:
            reason = f"nvidia-smi topo -m did not answer within {timeout} s"
    else:
        reason = "no nvidia-smi on this machine"
    return {
        "measured": False,
        "text": TOPO_EXAMPLE,
        "source": f"{reason}; EXAMPLE of the format for an 8-GPU NVSwitch node, not this machine",
    }
