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

DDP's buckets, measured, are unit 09's (``course_lib.parallel.bucket_sweep``).

Conventions (nccl-tests, https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md):
``size_bytes`` is the full buffer: the all-reduce tensor, the all-gather *output*, the
reduce-scatter *input*. ``algbw = size / time`` and ``busbw = algbw x 2(n-1)/n`` for all-reduce,
``x (n-1)/n`` for all-gather and reduce-scatter; GB/s means 1e9 bytes per second.
"""

from __future__ import annotations

import math
import shutil
import statistics
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd
import torch
import torch.distributed as dist

from course_lib import validate
from course_lib.measure import estimate
from course_lib.measure.timing import time_collective
from course_lib.runtime import compat

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
    "TOPO_EXAMPLE",
]

#: the collectives :func:`collective_sweep` times (the three that data/ZeRO parallelism uses)
SWEEP_COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


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
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread, as each gloo rank's transport copies with one
    try:
        r = time_fn(lambda: dst.copy_(src), warmup=warmup, repeat=repeat, sync=False)
    finally:
        torch.set_num_threads(threads)
    return {
        "size_bytes": 4 * n,
        "time_s": r.median_s,
        "time_min_s": r.min_s,
        "time_max_s": r.max_s,
        "GBps": 4 * n / r.median_s / 1e9,
    }


# --------------------------------------------------------------------------------------------
# the bandwidth sweep
# --------------------------------------------------------------------------------------------
def sweep_sizes(min_bytes: int, max_bytes: int, factor: int = 2) -> list[int]:
    """Message sizes min_bytes, min_bytes*factor, ... up to max_bytes (inclusive), in bytes."""
    lo = validate.count("min_bytes", min_bytes, minimum=1)
    hi = validate.count("max_bytes", max_bytes, minimum=1)
    f = validate.count("factor", factor, minimum=1)
    if hi < lo:
        raise ValueError(f"max_bytes={hi} must be >= min_bytes={lo}")
    if f < 2:
        raise ValueError(f"factor={f} must be >= 2")
    sizes = [lo]
    while sizes[-1] * f <= hi:
        sizes.append(sizes[-1] * f)
    return sizes


@dataclass(frozen=True)
class SweepConfig:
    """What :func:`collective_sweep` measures. The default is small enough for a 2-core laptop
    (a few seconds per world size); :meth:`full` is the nccl-tests-like sweep for real hardware."""

    collectives: tuple[str, ...] = SWEEP_COLLECTIVES
    """which collectives, a subset of SWEEP_COLLECTIVES"""
    world_sizes: tuple[int, ...] = (2, 4)
    """numbers of ranks; one launch per world size and collective"""
    min_bytes: int = estimate.KiB
    """smallest message (full buffer, see the module docstring), bytes"""
    max_bytes: int = 16 * estimate.MiB
    """largest message, bytes"""
    factor: int = 4
    """ratio between consecutive sizes"""
    warmup: int = 2
    """untimed iterations per size (connection setup, first-touch allocation)"""
    repeat: int = 5
    """timed iterations per size; the median is reported"""
    dtype: str = "float32"
    """element type of the buffers: float32, bfloat16 or float16"""
    backend: str = "auto"
    """'auto' (NCCL with one GPU per rank, else gloo), 'gloo' or 'nccl'"""
    timeout: float = 120.0
    """seconds before a launch is declared hung"""

    def __post_init__(self):
        object.__setattr__(self, "collectives", tuple(self.collectives))
        object.__setattr__(self, "world_sizes", tuple(self.world_sizes))
        if not self.collectives:
            raise ValueError(f"collectives must not be empty; valid choices: {SWEEP_COLLECTIVES}")
        for c in self.collectives:
            if c not in SWEEP_COLLECTIVES:
                raise ValueError(f"collectives contains {c!r}; valid choices: {SWEEP_COLLECTIVES}")
        if not self.world_sizes:
            raise ValueError("world_sizes must not be empty, e.g. (2, 4)")
        for w in self.world_sizes:
            if isinstance(w, bool) or not isinstance(w, int) or w < 2:
                raise ValueError(f"world_sizes contains {w!r}; each must be an int >= 2")
        if self.dtype not in _DTYPES:
            raise ValueError(
                f"dtype={self.dtype!r} is not supported; valid choices: {tuple(_DTYPES)}"
            )
        if self.backend not in ("auto", "gloo", "nccl"):
            raise ValueError(f"backend={self.backend!r}; valid choices: 'auto', 'gloo', 'nccl'")
        validate.count("warmup", self.warmup, minimum=0)
        validate.count("repeat", self.repeat, minimum=1)
        validate.number("timeout", self.timeout, positive=True)
        self.sizes()  # validates min_bytes, max_bytes, factor

    def sizes(self) -> list[int]:
        """The message sizes of the sweep, bytes."""
        return sweep_sizes(self.min_bytes, self.max_bytes, self.factor)

    @classmethod
    def full(cls, **overrides) -> SweepConfig:
        """1 KiB to 256 MiB in factors of 2, 20 timed iterations: for a real multi-GPU node."""
        kw = dict(
            min_bytes=estimate.KiB,
            max_bytes=256 * estimate.MiB,
            factor=2,
            warmup=5,
            repeat=20,
            timeout=600.0,
        )
        kw.update(overrides)
        return cls(**kw)


def _collective_op(collective: str, full: torch.Tensor, shard: torch.Tensor):
    """A zero-argument callable running one collective on preallocated buffers.
    all_gather: shard (S/n) -> full (S); reduce_scatter: full (S) -> shard (S/n)."""
    if collective == "all_reduce":
        return lambda: dist.all_reduce(full)
    gather, scatter = compat.all_gather_single, compat.reduce_scatter_single
    if collective == "all_gather":
        return lambda: gather(full, shard)
    return lambda: scatter(shard, full)


def _check_collective(
    collective: str, full: torch.Tensor, shard: torch.Tensor, rank: int, world_size: int
) -> None:
    """Run the collective once on known values and check the answer: a sweep that times a
    collective computing the wrong thing would be worse than no sweep."""
    full.fill_(rank + 1)
    shard.fill_(rank + 1)
    _collective_op(collective, full, shard)()
    n = full.numel() // world_size
    if collective == "all_reduce":
        ok = bool((full == world_size * (world_size + 1) / 2).all())
    elif collective == "all_gather":  # rank r's shard lands at [r n, (r+1) n)
        expected = torch.arange(1, world_size + 1, device=full.device).repeat_interleave(n)
        ok = bool((full == expected.to(full.dtype)).all())
    else:
        ok = bool((shard == world_size * (world_size + 1) / 2).all())
    if not ok:
        raise RuntimeError(
            f"rank {rank}: {collective} returned wrong values on "
            f"{dist.get_backend()}; the sweep would time a broken collective"
        )


def _sweep_worker(
    rank: int,
    world_size: int,
    collective: str,
    sizes: list[int],
    warmup: int,
    repeat: int,
    dtype: str,
) -> list[dict] | None:
    """Time one collective at every size on this rank; rank 0 returns the records.

    Each iteration starts after a barrier, so all ranks enter together; its time is the slowest
    rank's (MAX over ranks: the collective is done when the last rank is done), and the reported
    time is the median over ``repeat`` iterations.
    """
    from course_lib.runtime.device import rank_device

    device = rank_device()
    torch_dtype = _DTYPES[dtype]
    itemsize = torch.tensor([], dtype=torch_dtype).element_size()
    records = []
    for i, size in enumerate(sizes):
        numel = max(world_size, size // itemsize // world_size * world_size)  # divisible by n
        full = torch.empty(numel, dtype=torch_dtype, device=device)
        shard = torch.empty(numel // world_size, dtype=torch_dtype, device=device)
        if i == 0:
            _check_collective(collective, full, shard, rank, world_size)
        op = _collective_op(collective, full, shard)
        t = sorted(time_collective(op, warmup=warmup, repeat=repeat, device=device))
        records.append(
            {
                "size_bytes": numel * itemsize,
                "time_s": statistics.median(t),
                "time_min_s": t[0],
                "time_max_s": t[-1],
            }
        )
    return records if rank == 0 else None


def collective_sweep(config: SweepConfig | None = None, *, progress: bool = True) -> pd.DataFrame:
    """Time every collective of ``config`` at every size and world size on real ranks.

    One :func:`course_lib.launch` per (world size, collective) so the tqdm bar moves. Returns a
    tidy DataFrame, one row per (collective, world_size, size_bytes), columns: backend,
    collective, world_size, size_bytes, time_s (median of the slowest rank), time_min_s,
    time_max_s, repeat, algbw_GBps, busbw_GBps (estimate.busbw).
    """
    from tqdm.auto import tqdm

    from course_lib.runtime.device import resolve_backend
    from course_lib.runtime.launch import launch

    config = SweepConfig() if config is None else config
    if not isinstance(config, SweepConfig):
        raise TypeError(f"config must be a SweepConfig, got {type(config).__name__}")
    sizes = config.sizes()
    jobs = [(w, c) for w in config.world_sizes for c in config.collectives]
    rows = []
    bar = tqdm(jobs, desc="collective sweep", disable=not progress, leave=False)
    for world_size, collective in bar:
        backend = resolve_backend(config.backend, world_size)
        bar.set_postfix_str(f"{collective}, {world_size} ranks, {backend}")
        results = launch(
            _sweep_worker,
            world_size,
            collective,
            sizes,
            config.warmup,
            config.repeat,
            config.dtype,
            backend=backend,
            timeout=config.timeout,
        )
        for rec in results[0]:
            alg = estimate.algbw(rec["size_bytes"], rec["time_s"]) / 1e9
            rows.append(
                {
                    "backend": backend,
                    "collective": collective,
                    "world_size": world_size,
                    **rec,
                    "repeat": config.repeat,
                    "algbw_GBps": alg,
                    "busbw_GBps": estimate.busbw(alg, collective, world_size),
                }
            )
    return pd.DataFrame(rows)


_SWEEP_COLUMNS = ("collective", "world_size", "size_bytes", "time_s")


def _check_sweep_frame(df: pd.DataFrame, name: str = "df") -> None:
    if not isinstance(df, pd.DataFrame):
        raise TypeError(
            f"{name} must be a pandas DataFrame from collective_sweep, got {type(df).__name__}"
        )
    missing = [c for c in _SWEEP_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"{name} lacks columns {missing}; expected at least {_SWEEP_COLUMNS}")


def fit_sweep(df: pd.DataFrame) -> pd.DataFrame:
    """Fit T = alpha + beta * S (estimate.fit_alpha_beta, least squares) per collective and
    world size. Columns: collective, world_size, alpha_s, beta_s_per_byte, algbw_fit_GBps
    (1/beta / 1e9) and busbw_fit_GBps (what the link would have to carry); both NaN when
    beta <= 0, i.e. the times did not grow with size (a range too small for the noise).

    The fit minimises the *relative* error (``relative=True``): in plain seconds the largest
    messages would decide everything and alpha, microseconds beside milliseconds, would be
    whatever is left at S = 0 (often negative). Read it with the residual table beside it.
    """
    _check_sweep_frame(df)
    rows = []
    keys = [k for k in ("backend", "collective", "world_size") if k in df.columns]
    for key, g in df.groupby(keys, sort=False):
        key = dict(zip(keys, key if isinstance(key, tuple) else (key,)))
        alpha, beta = estimate.fit_alpha_beta(
            g["size_bytes"].tolist(), g["time_s"].tolist(), relative=True
        )
        # beta <= 0: the times do not grow with size (sizes too small for the noise): no bandwidth
        alg = (1.0 / beta / 1e9) if beta > 0 else math.nan
        rows.append(
            {
                **key,
                "alpha_s": alpha,
                "beta_s_per_byte": beta,
                "algbw_fit_GBps": alg,
                "busbw_fit_GBps": estimate.busbw(alg, key["collective"], key["world_size"])
                if beta > 0
                else math.nan,
            }
        )
    return pd.DataFrame(rows)


def sweep_residuals(df: pd.DataFrame, fits: pd.DataFrame) -> pd.DataFrame:
    """Measured beside predicted (alpha + beta S from ``fits``) for every row of the sweep:
    adds predicted_s, residual_s (measured - predicted) and residual_pct (of measured)."""
    _check_sweep_frame(df)
    keys = [k for k in ("backend", "collective", "world_size") if k in df.columns and k in fits]
    out = df.merge(fits[[*keys, "alpha_s", "beta_s_per_byte"]], on=keys, how="left")
    out["predicted_s"] = out["alpha_s"] + out["beta_s_per_byte"] * out["size_bytes"]
    out["residual_s"] = out["time_s"] - out["predicted_s"]
    out["residual_pct"] = 100.0 * out["residual_s"] / out["time_s"]
    return out.drop(columns=["alpha_s", "beta_s_per_byte"])


def heldout_fit(
    df: pd.DataFrame, *, collective: str = "all_reduce", world_size: int = 2, every: int = 2
) -> pd.DataFrame:
    """Fit alpha and beta on some sizes of a sweep and predict the others.

    Of the sizes of ``collective`` on ``world_size`` ranks (ascending), every ``every``-th one
    starting from the second is held out; ``estimate.fit_alpha_beta(..., relative=True)`` is fitted
    on the rest (so the smallest and, when the count allows, the largest size are always fitted:
    the held-out sizes are interpolated). Returns one row per held-out size: size_bytes,
    measured_s, predicted_s, error_pct = 100 (predicted - measured) / measured. A residual on
    the points of the fit itself flatters the model; this is the error on points it never saw.
    """
    _check_sweep_frame(df)
    validate.count("every", every, minimum=2)
    g = df[(df["collective"] == collective) & (df["world_size"] == world_size)].sort_values(
        "size_bytes"
    )
    if len(g) < 3:
        raise ValueError(
            f"collective={collective!r}, world_size={world_size}: need at least 3 sizes "
            f"in df to hold some out, found {len(g)}"
        )
    held = [i for i in range(1, len(g)) if i % every == 1 and i != len(g) - 1]
    fit = [i for i in range(len(g)) if i not in held]
    alpha, beta = estimate.fit_alpha_beta(
        g["size_bytes"].iloc[fit].tolist(), g["time_s"].iloc[fit].tolist(), relative=True
    )
    out = g.iloc[held][["size_bytes", "time_s"]].rename(columns={"time_s": "measured_s"})
    out["predicted_s"] = alpha + beta * out["size_bytes"]
    out["error_pct"] = 100.0 * (out["predicted_s"] - out["measured_s"]) / out["measured_s"]
    return out.reset_index(drop=True)


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
    out = []
    for name, calls, size, collective, overlaps in rows:
        out.append(
            {
                "parallelism": name,
                "calls_per_step": calls,
                "bytes_per_call": size,
                "nvlink_s": per_step(calls, size, collective, nv),
                "infiniband_s": per_step(calls, size, collective, ib),
                "overlaps_compute": overlaps,
            }
        )
    return pd.DataFrame(out)


# --------------------------------------------------------------------------------------------
# published links -> predicted times
# --------------------------------------------------------------------------------------------
def link_table() -> pd.DataFrame:
    """estimate.LINK_SPEEDS as one table: name, kind, per_direction_GBps (what the course uses),
    headline_GBps (as the vendor quotes it), note, source."""
    return pd.DataFrame(
        [
            {
                "link": k.name,
                "kind": k.kind,
                "per_direction_GBps": k.per_direction_GBps,
                "headline_GBps": k.headline_GBps,
                "note": k.note,
                "source": k.source,
            }
            for k in estimate.LINK_SPEEDS.values()
        ]
    )


def gradient_allreduce_table(
    n_params: Sequence[float] = (1e9, 7e9), *, dtype: str = "bf16", world_size: int = 8
) -> pd.DataFrame:
    """Predicted ring all-reduce time of one step's gradients on every link of LINK_SPEEDS.

    One row per (model, link): n_params, grad_bytes (n_params x dtype bytes), link,
    per_direction_GBps, time_s at the per-direction figure (the course's convention) and
    time_headline_s at the vendor's headline figure (estimate.allreduce_time_on_link, no latency
    term). E.g. 1e9 bf16 gradients = 2 GB over 8 ranks: ~7.8 ms on NVLink H100 (450 GB/s per
    direction; ~3.9 ms with its 900 GB/s headline), ~70 ms at 50 GB/s.
    """
    width = estimate.dtype_bytes(dtype)
    rows = []
    for n in n_params:
        if isinstance(n, float) and n.is_integer():
            n = int(n)  # papers write 7e9
        grad_bytes = validate.count("n_params", n, minimum=1) * width
        for link in estimate.LINK_SPEEDS.values():
            rows.append(
                {
                    "n_params": int(n),
                    "grad_bytes": grad_bytes,
                    "link": link.name,
                    "per_direction_GBps": link.per_direction_GBps,
                    "time_s": estimate.allreduce_time_on_link(
                        grad_bytes, world_size, link.per_direction_GBps
                    ),
                    "time_headline_s": estimate.allreduce_time_on_link(
                        grad_bytes, world_size, link.headline_GBps
                    ),
                }
            )
    return pd.DataFrame(rows)


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
            reason = (out.stderr or out.stdout).strip().splitlines()[:1] or ["no output"]
            reason = f"nvidia-smi topo -m failed ({reason[0]})"
        except subprocess.TimeoutExpired:
            reason = f"nvidia-smi topo -m did not answer within {timeout} s"
    else:
        reason = "no nvidia-smi on this machine"
    return {
        "measured": False,
        "text": TOPO_EXAMPLE,
        "source": f"{reason}; EXAMPLE of the format for an 8-GPU NVSwitch node, not this machine",
    }
