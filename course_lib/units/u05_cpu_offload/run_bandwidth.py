"""Unit 05, the tiers' bandwidth and the parts of an offloaded step, measured and predicted.

Used by notebooks/05_cpu_offload.ipynb through :mod:`run` (which re-exports these names).
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch

from course_lib import kit, validate
from course_lib.data import permutation_batch
from course_lib.measure import estimate
from course_lib.models import GPT, GPTConfig
from course_lib.techniques.offload import PHASES, OffloadAdamW, drop_page_cache
from course_lib.units.u05_cpu_offload._setup import CONFIG, LR, _models, _plain_optimizer


# --------------------------------------------------------------------------------------------
# bandwidth of the tiers of this machine
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TierRow:
    """One place state can live on this machine, timed (:func:`tier_bandwidth`)."""

    tier: str
    GBps: float
    bytes: int
    note: str


@dataclass(frozen=True)
class CopyRow:
    """Host <-> device copies from one kind of host memory, one direction (:func:`h2d_bandwidth`)."""

    memory: str
    direction: str
    GBps: float
    bytes: int


def _median(xs: Iterable[float]) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2]


def tier_bandwidth(
    nbytes: int = 64 << 20, *, repeat: int = 3, directory: str | None = None
) -> pd.DataFrame:
    """GB/s (1e9 B/s, median of ``repeat``) of the places state can live on this machine:

    * ``RAM copy``: ``torch`` copy between two preallocated host buffers (what a "transfer" is
      when device and host are the same memory);
    * ``file write + fsync``: written and flushed to the disk;
    * ``file read, cache dropped``: read after ``posix_fadvise(POSIX_FADV_DONTNEED)`` -- from the
      disk (where the call does not exist, from the page cache: the row says so);
    * ``file read, cached``: read again at once, from the kernel's page cache.
    """
    nbytes = validate.count("nbytes", nbytes, minimum=4096)
    repeat = validate.count("repeat", repeat, minimum=1)
    src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8)
    dst = torch.empty_like(src)
    dst.copy_(src)  # touch every page first: the timed copy must not count page faults
    buf = dst.numpy().data  # the tensor's bytes, as a memoryview
    times: dict[str, list[float]] = {
        "RAM copy": [],
        "file write + fsync": [],
        "file read, cache dropped": [],
        "file read, cached": [],
    }
    fd, path = tempfile.mkstemp(prefix="tier-", suffix=".bin", dir=directory)
    try:
        with os.fdopen(fd, "r+b", buffering=0) as f:
            for _ in range(repeat):
                t0 = time.perf_counter()
                dst.copy_(src)
                times["RAM copy"].append(time.perf_counter() - t0)
                f.seek(0)
                t0 = time.perf_counter()
                f.write(src.numpy().data)
                os.fsync(f.fileno())
                times["file write + fsync"].append(time.perf_counter() - t0)
                dropped = drop_page_cache(f.fileno())
                for key in ("file read, cache dropped", "file read, cached"):
                    f.seek(0)
                    t0 = time.perf_counter()
                    f.readinto(buf)
                    times[key].append(time.perf_counter() - t0)
    finally:
        os.remove(path)
    note = {
        "file read, cache dropped": ""
        if dropped
        else "posix_fadvise is not available here: this read may come from the page cache"
    }
    rows = [
        TierRow(k, nbytes / _median(v) / 1e9, nbytes, note.get(k, "")) for k, v in times.items()
    ]
    return kit.frame(rows, TierRow).set_index("tier")


def h2d_bandwidth(nbytes: int = 256 << 20, *, repeat: int = 5) -> pd.DataFrame:
    """Host <-> device copies on a CUDA GPU, GB/s (median of ``repeat``): from pinned
    (page-locked, ``pin_memory=True``) and from pageable host memory, both directions.
    Pageable copies go through a pinned bounce buffer of the driver; pinned ones are one DMA.
    Raises RuntimeError without CUDA."""
    if not torch.cuda.is_available():
        raise RuntimeError(
            "h2d_bandwidth needs a CUDA device; on this machine use tier_bandwidth()"
        )
    from course_lib.measure.timing import time_fn

    nbytes = validate.count("nbytes", nbytes, minimum=1)
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    rows = []
    for pinned in (True, False):
        host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned)
        host.fill_(1)
        for direction, fn in (
            ("host -> device", lambda h=host, pin=pinned: dev.copy_(h, non_blocking=pin)),
            ("device -> host", lambda h=host, pin=pinned: h.copy_(dev, non_blocking=pin)),
        ):
            r = time_fn(fn, warmup=2, repeat=repeat, sync=True)
            memory = "pinned" if pinned else "pageable"
            rows.append(CopyRow(memory, direction, nbytes / r.median_s / 1e9, nbytes))
    return kit.frame(rows, CopyRow)


# --------------------------------------------------------------------------------------------
# the parts of an offloaded step
# --------------------------------------------------------------------------------------------
def _timed_step(
    model: GPT, optimizer: Any, idx: torch.Tensor, tgt: torch.Tensor, sync: Callable[[], None]
) -> float:
    """Seconds of one plain training step (zero_grad, forward, backward, step), synchronized."""
    sync()
    t0 = time.perf_counter()
    optimizer.zero_grad(set_to_none=True)
    model.loss(idx, tgt).backward()
    optimizer.step()
    sync()
    return time.perf_counter() - t0


@dataclass(frozen=True)
class StepRow:
    """One measured offloaded step of :func:`step_breakdown` (seconds; bytes moved by each phase
    of ``OffloadAdamW``, None where it moved none)."""

    step: int
    compute: float
    to_host: float
    store_read: float
    host_adam: float
    store_write: float
    to_device: float
    total: float  # timed around the whole step by its own clock
    plain: float  # the same step with the plain optimizer on the device
    to_host_bytes: int | None
    store_read_bytes: int | None
    host_adam_bytes: int | None
    store_write_bytes: int | None
    to_device_bytes: int | None


def _step_row(step: int, compute: float, opt: OffloadAdamW, total: float, plain: float) -> StepRow:
    """One step's row: the optimizer's own phase timings and bytes (None: it moved none)."""
    t, b = opt.last_times, {p: opt.bytes_moved[p] or None for p in PHASES}
    phases = (t["to_host"], t["store_read"], t["host_adam"], t["store_write"], t["to_device"])
    moved = (b["to_host"], b["store_read"], b["host_adam"], b["store_write"], b["to_device"])
    return StepRow(step, compute, *phases, total, plain, *moved)


def step_breakdown(
    *,
    tier: str = "file",
    steps: int = 6,
    config: GPTConfig | None = None,
    batch: int = 8,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    warmup: int = 1,
) -> pd.DataFrame:
    """Time every part of ``steps`` offloaded steps (after ``warmup`` untimed ones).

    One row per step: ``compute`` (forward + backward), the phases of ``OffloadAdamW``
    (``to_host``, ``store_read``, ``host_adam``, ``store_write``, ``to_device``; seconds), and
    ``total``, timed around the whole step by its own clock -- the parts are *not* summed to
    make it. Also ``plain`` (the same step with the plain optimizer on the device, timed the
    same way) and the bytes of each transfer.
    """
    steps = validate.count("steps", steps, minimum=1)
    config = config or CONFIG
    plain, off = _models(config, dtype, device)
    ref = _plain_optimizer(plain, dtype)
    opt = OffloadAdamW(off.parameters(), lr=LR, tier=tier)
    gen = torch.Generator().manual_seed(1)
    sync: Callable[[], None] = (
        (lambda: torch.cuda.synchronize())
        if torch.device(device).type == "cuda"
        else (lambda: None)
    )
    rows = []
    try:
        for k in range(warmup + steps):
            idx, tgt = (
                t.to(device)
                for t in permutation_batch(config, batch, config.block_size, generator=gen)
            )
            t_plain = _timed_step(plain, ref, idx, tgt, sync)
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            off.loss(idx, tgt).backward()
            sync()
            t1 = time.perf_counter()
            opt.step()
            t_end = time.perf_counter()
            if k >= warmup:
                rows.append(_step_row(k - warmup, t1 - t0, opt, t_end - t0, t_plain))
    finally:
        opt.close()
    df = kit.frame(rows, StepRow)
    # a phase's bytes only where it moved some: the memory tier has no store_* columns
    return df.drop(columns=[f"{p}_bytes" for p in PHASES if df[f"{p}_bytes"].isna().all()])


def predicted_step_times(parts: pd.DataFrame | dict[str, float]) -> dict[str, float]:
    """``estimate.offload_step_time`` from measured parts (a :func:`step_breakdown` row or the
    medians of its columns): ``serial_s`` (one after the other) and ``overlapped_s`` (max)."""
    get = parts.get  # a dict or a DataFrame row: both answer [name] and get(name, default)
    kw = dict(
        compute_s=float(parts["compute"]),
        transfer_s=float(parts["to_host"]) + float(parts["to_device"]),
        host_s=float(parts["host_adam"]),
        storage_s=float(get("store_read", 0.0)) + float(get("store_write", 0.0)),
    )
    return {
        "serial_s": estimate.offload_step_time(**kw, overlap=False),
        "overlapped_s": estimate.offload_step_time(**kw, overlap=True),
    }
