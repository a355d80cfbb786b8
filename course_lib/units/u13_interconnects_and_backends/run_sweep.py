"""Unit 13, the bandwidth sweep: collectives timed over sizes and world sizes, and the alpha-beta fit.

Used by notebooks/13_interconnects_and_backends.ipynb through :mod:`run` (which re-exports these
names; conventions in its docstring).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch
import torch.distributed as dist

from course_lib import kit, validate
from course_lib.measure import estimate
from course_lib.measure.timing import time_collective
from course_lib.runtime import compat

#: the collectives :func:`collective_sweep` times (the three that data/ZeRO parallelism uses)
SWEEP_COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")


_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


# --------------------------------------------------------------------------------------------
# the bandwidth sweep
# --------------------------------------------------------------------------------------------
def sweep_sizes(min_bytes: int, max_bytes: int, factor: int = 2) -> list[int]:
    """Message sizes min_bytes, min_bytes*factor, ... up to max_bytes (inclusive), in bytes."""
    lo = validate.count("min_bytes", min_bytes, minimum=1)
    hi = validate.count("max_bytes", max_bytes, minimum=lo)  # at least min_bytes
    f = validate.count("factor", factor, minimum=2)
    sizes = [lo]
    while sizes[-1] * f <= hi:
        sizes.append(sizes[-1] * f)
    return sizes


@dataclass(frozen=True)
class SweepConfig:
    """What :func:`collective_sweep` measures. The default is small enough for a 2-core laptop
    (a few seconds per world size); :meth:`full` is the nccl-tests-like sweep for real hardware."""

    #: which collectives, a subset of SWEEP_COLLECTIVES
    collectives: tuple[str, ...] = SWEEP_COLLECTIVES
    #: numbers of ranks; one launch per world size and collective
    world_sizes: tuple[int, ...] = (2, 4)
    #: smallest message (full buffer, see the module docstring), bytes
    min_bytes: int = estimate.KiB
    #: largest message, bytes
    max_bytes: int = 16 * estimate.MiB
    #: ratio between consecutive sizes
    factor: int = 4
    #: untimed iterations per size (connection setup, first-touch allocation)
    warmup: int = 2
    #: timed iterations per size; the median is reported
    repeat: int = 5
    #: element type of the buffers: float32, bfloat16 or float16
    dtype: str = "float32"
    #: 'auto' (NCCL with one GPU per rank, else gloo), 'gloo' or 'nccl'
    backend: str = "auto"
    #: seconds before a launch is declared hung
    timeout: float = 120.0

    def __post_init__(self) -> None:
        collectives = validate.choices("collectives", tuple(self.collectives), SWEEP_COLLECTIVES)
        object.__setattr__(self, "collectives", tuple(collectives))
        world_sizes = validate.counts("world_sizes", self.world_sizes, minimum=2)
        object.__setattr__(self, "world_sizes", tuple(world_sizes))
        validate.choice("dtype", self.dtype, tuple(_DTYPES))
        validate.choice("backend", self.backend, ("auto", "gloo", "nccl"))
        validate.count("warmup", self.warmup, minimum=0)
        validate.count("repeat", self.repeat, minimum=1)
        validate.number("timeout", self.timeout, positive=True)
        self.sizes()  # validates min_bytes, max_bytes, factor

    def sizes(self) -> list[int]:
        """The message sizes of the sweep, bytes."""
        return sweep_sizes(self.min_bytes, self.max_bytes, self.factor)

    @classmethod
    def full(cls, **overrides: Any) -> SweepConfig:
        """1 KiB to 256 MiB in factors of 2, 20 timed iterations: for a real multi-GPU node."""
        kw: dict[str, Any] = dict(
            min_bytes=estimate.KiB,
            max_bytes=256 * estimate.MiB,
            factor=2,
            warmup=5,
            repeat=20,
            timeout=600.0,
        )
        kw.update(overrides)
        return cls(**kw)


@dataclass(frozen=True)
class SweepRow:
    """:func:`collective_sweep`: one collective at one size on ``world_size`` ranks (rank 0's
    record of the slowest rank's times, nccl-tests' bandwidths)."""

    backend: str
    collective: str
    world_size: int
    size_bytes: int
    time_s: float
    time_min_s: float
    time_max_s: float
    repeat: int
    algbw_GBps: float
    busbw_GBps: float


def _collective_op(collective: str, full: torch.Tensor, shard: torch.Tensor) -> Callable[[], Any]:
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
    collective: estimate.Collective,
    sizes: list[int],
    warmup: int,
    repeat: int,
    dtype: str,
) -> list[SweepRow] | None:
    """Time one collective at every size on this rank; rank 0 returns the rows.

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
        size, median = numel * itemsize, statistics.median(t)
        alg = estimate.algbw(size, median) / 1e9
        bus = estimate.busbw(alg, collective, world_size)
        row = (size, median, t[0], t[-1], repeat, alg, bus)
        records.append(SweepRow(str(dist.get_backend()), collective, world_size, *row))
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
    rows: list[SweepRow] = []
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
        rows += results[0]
    return kit.frame(rows, SweepRow)


@dataclass(frozen=True)
class FitRow:
    """:func:`fit_sweep`: alpha and beta of one collective on ``world_size`` ranks (``backend``:
    None where the sweep has no backend column; the frame then has none either)."""

    backend: str | None
    collective: str
    world_size: int
    alpha_s: float
    beta_s_per_byte: float
    algbw_fit_GBps: float
    busbw_fit_GBps: float


_SWEEP_COLUMNS = ("collective", "world_size", "size_bytes", "time_s")


def _check_sweep_frame(df: pd.DataFrame, name: str = "df") -> None:
    if not isinstance(df, pd.DataFrame):
        raise TypeError(
            f"{name} must be a pandas DataFrame from collective_sweep, got {type(df).__name__}"
        )
    missing = [c for c in _SWEEP_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(
            f"{name} = a DataFrame without columns {missing}: expected at least {_SWEEP_COLUMNS}"
        )


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
        bus = estimate.busbw(alg, key["collective"], key["world_size"]) if beta > 0 else math.nan
        rows.append(
            FitRow(key.get("backend"), key["collective"], key["world_size"], alpha, beta, alg, bus)
        )
    fits = kit.frame(rows, FitRow)
    return fits if "backend" in keys else fits.drop(columns="backend")


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
            f"df = a sweep with {len(g)} sizes of collective={collective!r}, "
            f"world_size={world_size}: expected at least 3, to hold some out"
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
