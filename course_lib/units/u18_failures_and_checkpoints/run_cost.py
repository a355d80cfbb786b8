"""Unit 18, what a checkpoint costs: bytes and seconds against model size on this machine,
blocking ``save`` against ``async_save`` (the seconds the training loop waits).

Used by notebooks/18_failures_and_checkpoints.ipynb through :mod:`run` (which re-exports these).
"""

from __future__ import annotations

import pathlib
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import pandas as pd

import course_lib
from course_lib import kit, validate
from course_lib.measure import estimate

#: parameter counts the lecture saves (fp32 weights and Adam's two moments: 12 B each)
SIZES = (2**16, 2**18, 2**20, 2**21)


@dataclass(frozen=True)
class CostRow:
    """:func:`save_cost`: one size saved blocking and with ``async_save`` (rank 0's clock)."""

    params: int
    bytes_on_disk: int = field(metadata=kit.column("bytes on disk"))
    blocking_s: float = field(metadata=kit.column("blocking s"))
    async_blocked_s: float = field(metadata=kit.column("async: loop blocked s"))
    async_written_s: float = field(metadata=kit.column("async: until written s"))


def _cost_rank(rank, world_size, *, sizes, root):
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from course_lib import resilience

    mesh = init_device_mesh("cpu", (world_size,))
    warm = {"w": distribute_tensor(torch.zeros(64), mesh, [Shard(0)])}
    resilience.save(warm, pathlib.Path(root) / "warm-up")  # the first save pays for imports
    rows = []
    for n in sizes:
        gen = torch.Generator().manual_seed(n)
        state = {
            name: distribute_tensor(torch.randn(n, generator=gen), mesh, [Shard(0)])
            for name in ("weights", "exp_avg", "exp_avg_sq")
        }
        path = pathlib.Path(root) / f"n{n}"
        t0 = time.perf_counter()
        resilience.save(state, path / "blocking")
        blocking = time.perf_counter() - t0
        t0 = time.perf_counter()
        pending = resilience.save(state, path / "async", async_=True)
        blocked = time.perf_counter() - t0
        pending.wait()
        total = time.perf_counter() - t0
        size = resilience.checkpoint_bytes(path / "blocking")
        rows.append(CostRow(n, size, blocking, blocked, total))
    return rows


def save_cost(sizes: Sequence[int] = SIZES, *, world_size: int = 2) -> pd.DataFrame:
    """Save fp32 weights and two Adam moments of each size (sharded over ``world_size`` ranks)
    blocking and with ``async_save``. Rows (rank 0's clock): params, bytes on disk (measured),
    predicted bytes (12 B/param, ``estimate.checkpoint_size_bytes``), seconds blocking, seconds
    the loop waits under async_save and until the write is done, and the MB/s of the blocking
    save ("into page cache": small files written and closed land in memory, not on the disk)."""
    ns = validate.counts("sizes", sizes)
    root = tempfile.mkdtemp(prefix="u18_cost_")
    try:
        rows = course_lib.launch(_cost_rank, world_size, sizes=tuple(ns), root=root)[0]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    df = kit.frame(rows, CostRow)
    df.insert(
        2,
        "predicted bytes",
        [estimate.checkpoint_size_bytes(n, param_bytes=0, master_bytes=4) for n in ns],
    )
    df["MB/s into page cache"] = df["bytes on disk"] / df["blocking s"] / 1e6
    return df
