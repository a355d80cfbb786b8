"""DDP's gradient buckets, measured: how many, how big, and when backward hides their
all-reduce. ``bucket_cap_mb`` swept on real ranks, for torch's DistributedDataParallel and for
a DataParallel of the caller's (``ours``: unit 09 passes the course's ``parallel.ddp``), with a
per-rank timeline of every step.

Introduced in notebooks/09_data_parallelism.ipynb (overlap, our DDP beside torch's); unit 13
(notebooks/13_interconnects_and_backends.ipynb) fits the alpha-beta model to the same sweep.
"""

from __future__ import annotations

import contextlib
import statistics
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import pandas as pd
import torch
import torch.distributed as dist
from torch import nn

from course_lib import validate
from course_lib.measure.timeline import StepRecorder
from course_lib.runtime.device import sync

# --------------------------------------------------------------------------------------------
# DDP buckets: how many, how big, and when they are all-reduced
# --------------------------------------------------------------------------------------------
__all__ = ["IMPLEMENTATIONS", "BucketSweep", "ddp_bucket_sweep", "torch_ddp_buckets"]

#: what :func:`ddp_bucket_sweep` can run: torch's DistributedDataParallel, the course's DataParallel
IMPLEMENTATIONS = ("torch", "course")

#: the caller's DataParallel class, run as "course": ``ours(model, bucket_cap_mb=..., recorder=...)``
#: with ``.buckets`` (parameter names per bucket, in launch order)
Ours = Callable[..., Any]


@dataclass(frozen=True)
class BucketSweep:
    """Result of :func:`ddp_bucket_sweep`.

    ``summary``: one row per implementation and bucket_cap_mb: implementation ("torch" or
    "course"), n_buckets (comm-hook calls per step),
    bucket_bytes (tuple, in the order they were reduced), logged_bucket_bytes (torch: from DDP's
    ``_get_ddp_logging_data()['rebuilt_bucket_sizes']`` or ``['bucket_sizes']``; course: from
    ``DataParallel.buckets``), grad_bytes,
    step_time_s (forward + backward with DDP, median over steps of the slowest rank),
    local_step_time_s (the same step on the bare model, no communication; so
    step_time_s - local_step_time_s is what DDP's communication adds), backward_time_s (median,
    rank 0),
    grad_max_abs_err (rank 0's DDP gradient against the mean of every rank's gradient computed
    on one process: checks that the timed comm hook reduces correctly).
    ``events``: the per-rank timeline of the last measured step of every cap, recorded with
    ``measure.timing.EventLog`` and merged with ``merge_event_logs``: rank, name, start, end,
    duration (seconds on the host's shared monotonic clock, 0 = the first event of that step on
    any rank), lane ('compute': one layer's backward; 'comm': one bucket's all-reduce), bytes
    (buckets only), bucket_cap_mb, implementation.
    """

    summary: pd.DataFrame
    events: pd.DataFrame = field(repr=False)


def torch_ddp_buckets(
    model: nn.Module, bucket_cap_mb: float, example_input: torch.Tensor, *, steps: int = 4
) -> list[list[str]]:
    """Parameter names per bucket of torch's DistributedDataParallel for ``model`` (inside a
    rank), in the order DDP launches them. DDP starts with one bucket and rebuilds its buckets
    after the first backward, in the order gradients arrived; its logger reports them
    (``rebuilt_per_bucket_param_indices``) from the third step on, so ``steps`` forward/backward
    passes on ``example_input`` are run first (they change ``.grad``, not the parameters)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    steps = validate.count("steps", steps, minimum=3)
    ddp = DDP(model, bucket_cap_mb=validate.number("bucket_cap_mb", bucket_cap_mb, positive=True))
    for _ in range(steps):
        ddp(example_input).sum().backward()
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    data = ddp._get_ddp_logging_data()
    text = data["rebuilt_per_bucket_param_indices"]  # e.g. "5 4 3, 2 1 0"
    return [[names[int(i)] for i in part.split()] for part in text.split(",")]


def _mlp(width: int, depth: int) -> torch.nn.Module:
    """``depth`` Linear(width, width) layers with ReLU between them (course_lib.models.MLP)."""
    from course_lib.models import MLP, MLPConfig

    return MLP(MLPConfig(in_features=width, hidden=(width,) * (depth - 1), out_features=width))


Implementation = Literal["torch", "course"]


@dataclass(frozen=True)
class _Setup:
    """What every rank of a sweep runs: the model's size, the batch, the steps timed."""

    width: int
    depth: int
    batch: int
    warmup: int
    steps: int


def _wrap(
    implementation: Implementation,
    model: nn.Module,
    cap: float,
    rec: StepRecorder,
    ours: Ours | None = None,
) -> tuple[Any, Callable[[], tuple[int, ...]]]:
    """(wrapped model, function returning the bucket sizes the wrapper reports)."""
    if implementation == "course":
        assert ours is not None  # ddp_bucket_sweep refuses "course" without it
        ddp = ours(model, bucket_cap_mb=cap, recorder=rec)
        sizes = dict((n, p.numel() * p.element_size()) for n, p in model.named_parameters())
        return ddp, lambda: tuple(sum(sizes[n] for n in names) for names in ddp.buckets)
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch_ddp = DDP(model, bucket_cap_mb=cap)
    torch_ddp.register_comm_hook(None, rec.comm_hook)

    def logged() -> tuple[int, ...]:
        data = torch_ddp._get_ddp_logging_data()
        sizes = data.get("rebuilt_bucket_sizes") or data.get("bucket_sizes") or ""
        return tuple(int(s) for s in str(sizes).split(",") if s.strip())

    return torch_ddp, logged


def _timed(device: torch.device, fn: Callable[[], object]) -> float:
    """Seconds ``fn()`` takes on every rank, started together (barrier) and synchronized."""
    dist.barrier()
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t0


def _local_times(
    model: nn.Module, ddp: Any, x: torch.Tensor, impl: Implementation, setup: _Setup
) -> list[float]:
    """The same step without DDP (no communication), for the overhead DDP adds; our
    DataParallel hooks the parameters themselves, so it is told to stay quiet."""

    def step() -> None:
        with ddp.no_sync() if impl == "course" else contextlib.nullcontext():
            model(x).square().mean().backward()

    times = []
    for i in range(setup.warmup + setup.steps):
        model.zero_grad(set_to_none=True)
        t = _timed(x.device, step)
        if i >= setup.warmup:
            times.append(t)
    return times


def _ddp_times(
    model: nn.Module, ddp: Any, rec: StepRecorder, x: torch.Tensor, setup: _Setup
) -> tuple[list[float], list[float]]:
    """(step times, backward times) of the DDP step; the recorder keeps the last timeline."""
    step_times, bwd_times = [], []
    marks: list[float] = []  # when each step's backward started

    def step() -> None:
        loss = ddp(x).square().mean()
        marks.append(time.perf_counter())
        loss.backward()  # returns after DDP waited for every bucket's future

    for i in range(setup.warmup + setup.steps):
        model.zero_grad(set_to_none=True)
        rec.new_step()  # keeps only the last step's timeline
        t = _timed(x.device, step)
        if i >= setup.warmup:
            step_times.append(t)
            bwd_times.append(time.perf_counter() - marks[-1])
    return step_times, bwd_times


def _grad_error(model: nn.Module, world_size: int, setup: _Setup) -> float:
    """Parity: our timed hook must leave the gradient DDP's default hook leaves, the mean over
    ranks of each rank's gradient; recomputed here on one process from every rank's x."""
    device = next(model.parameters()).device
    ref = _mlp(setup.width, setup.depth).to(device)
    ref.load_state_dict(model.state_dict())
    for r in range(world_size):
        torch.manual_seed(1 + r)
        x_r = torch.randn(setup.batch, setup.width, device=device)  # (B, width): rank r's batch
        (ref(x_r).square().mean() / world_size).backward()
    return max(
        float((p.grad - q.grad).abs().max())
        for p, q in zip(model.parameters(), ref.parameters())
        if p.grad is not None and q.grad is not None
    )


def _measure_cap(
    rank: int, world_size: int, impl: Implementation, cap: float, setup: _Setup, ours: Ours | None
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One cap on a fresh model: (the summary row, this rank's timeline of the last step)."""
    from course_lib.runtime.device import rank_device

    device = rank_device()
    torch.manual_seed(0)
    model = _mlp(setup.width, setup.depth).to(device)
    grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    rec = StepRecorder(rank, world_size, model.layers)
    ddp, logged_sizes = _wrap(impl, model, cap, rec, ours)
    torch.manual_seed(1 + rank)  # each rank its own data, as in data parallelism
    x = torch.randn(setup.batch, setup.width, device=device)  # (B, width)
    local = _local_times(model, ddp, x, impl, setup)
    step_times, bwd_times = _ddp_times(model, ddp, rec, x, setup)
    t = torch.tensor([step_times, local], dtype=torch.float64, device=device)  # (2, steps)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)  # the slowest rank's
    t_ddp, t_local = t.cpu().tolist()
    row = {
        "implementation": impl,
        "bucket_cap_mb": cap,
        "n_buckets": len(rec.calls),
        "bucket_bytes": tuple(rec.calls),
        "logged_bucket_bytes": logged_sizes(),
        "grad_bytes": grad_bytes,
        "step_time_s": statistics.median(t_ddp),
        "local_step_time_s": statistics.median(t_local),
        "backward_time_s": statistics.median(bwd_times),
        "grad_max_abs_err": _grad_error(model, world_size, setup),
    }
    return row, rec.log.to_records()


def _bucket_worker(
    rank: int,
    world_size: int,
    caps_mb: list[float],
    setup: _Setup,
    implementations: tuple[Implementation, ...] = ("torch",),
    ours: Ours | None = None,
) -> dict[str, Any]:
    """Build a fresh DDP model per cap; count buckets with a comm hook; log a timeline."""
    # The module pre-hook of layer 0 fires although its input x needs no gradient, which is what
    # we want (its output gradient has arrived); torch warns about that case, harmlessly here.
    warnings.filterwarnings("ignore", message="Full backward hook is firing", category=UserWarning)
    summary, events = [], {}
    for impl, cap in [(i, c) for i in implementations for c in caps_mb]:
        row, events[impl, cap] = _measure_cap(rank, world_size, impl, cap, setup, ours)
        summary.append(row)
        dist.barrier()
    return {"summary": summary, "events": events}


def ddp_bucket_sweep(
    bucket_caps_mb: Sequence[float] = (1, 2, 4, 25),
    *,
    world_size: int = 2,
    width: int = 512,
    depth: int = 8,
    batch: int = 64,
    warmup: int = 2,
    steps: int = 4,
    implementations: Sequence[Implementation] | Implementation = ("torch",),
    ours: Ours | None = None,
    backend: Literal["auto", "gloo", "nccl"] = "auto",
    timeout: float = 120.0,
) -> BucketSweep:
    """DDP over ``world_size`` ranks with ``bucket_cap_mb`` swept, for each of
    ``implementations`` ("torch": torch.nn.parallel.DistributedDataParallel, buckets counted by a
    comm hook (``register_comm_hook``) and checked against DDP's own logging data; "course":
    ``ours``, the caller's DataParallel class (unit 09 passes ``parallel.ddp.DataParallel``),
    buckets counted through its ``recorder``), and a per-rank timeline of the last step.

    The model is course_lib.models.MLP with ``depth`` Linear(width, width) layers: (width^2 +
    width) x 4 bytes of fp32 gradient per layer. The first ``warmup`` steps are not timed: DDP rebuilds its buckets after
    the first backward, in the order gradients became ready. Returns a :class:`BucketSweep`.
    """
    from course_lib.measure.timing import merge_event_logs
    from course_lib.runtime.launch import launch

    caps = [validate.number("bucket_caps_mb[i]", c, positive=True) for c in bucket_caps_mb]
    if not caps:
        raise ValueError("bucket_caps_mb = (): expected at least one cap, e.g. (1, 2, 4, 25)")
    validate.count("world_size", world_size, minimum=2)  # DDP needs peers to reduce with
    for name, v in (("width", width), ("depth", depth), ("batch", batch), ("steps", steps)):
        validate.count(name, v, minimum=1)
    validate.count("warmup", warmup, minimum=0)
    if isinstance(implementations, str):
        implementations = (implementations,)
    impls = tuple(validate.choices("implementations", implementations, IMPLEMENTATIONS))
    if "course" in impls and not callable(ours):
        raise TypeError(
            f"ours = {validate.describe(ours)}: implementations {impls} include 'course', "
            "which runs the caller's DataParallel class; pass it as ours=DataParallel"
        )
    # One launch for every cap: constructing the first DDP in a process imports torch._dynamo
    # (seconds on a small machine), a cost a launch per cap would pay again and again.
    setup = _Setup(width, depth, batch, warmup, steps)
    res = launch(
        _bucket_worker, world_size, caps, setup, impls, ours, backend=backend, timeout=timeout
    )
    frames = []
    for impl, cap in [(i, c) for i in impls for c in caps]:  # one clock origin per run: the
        ev = merge_event_logs([r["events"][impl, cap] for r in res])  # step's first event
        frames.append(ev.drop(columns=["meta"]).assign(bucket_cap_mb=cap, implementation=impl))
    events = pd.concat(frames, ignore_index=True)
    return BucketSweep(pd.DataFrame(res[0]["summary"]), events)
