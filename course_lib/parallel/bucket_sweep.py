"""DDP's gradient buckets, measured: how many, how big, and when backward hides their
all-reduce. ``bucket_cap_mb`` swept on real ranks, for torch's DistributedDataParallel and for
the course's own ``parallel.ddp.DataParallel``, with a per-rank timeline of every step.

Introduced in notebooks/09_data_parallelism.ipynb (overlap, our DDP beside torch's); unit 13
(notebooks/13_interconnects_and_backends.ipynb) fits the alpha-beta model to the same sweep.
"""

from __future__ import annotations

import contextlib
import statistics
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field

import pandas as pd
import torch
import torch.distributed as dist

from course_lib import validate
from course_lib.measure.timeline import StepRecorder
from course_lib.runtime.device import sync

# --------------------------------------------------------------------------------------------
# DDP buckets: how many, how big, and when they are all-reduced
# --------------------------------------------------------------------------------------------
__all__ = ["IMPLEMENTATIONS", "BucketSweep", "ddp_bucket_sweep", "torch_ddp_buckets"]

#: what :func:`ddp_bucket_sweep` can run: torch's DistributedDataParallel, the course's DataParallel
IMPLEMENTATIONS = ("torch", "course")


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
    model: torch.nn.Module, bucket_cap_mb: float, example_input, *, steps: int = 4
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
    text = ddp._get_ddp_logging_data()["rebuilt_per_bucket_param_indices"]  # e.g. "5 4 3, 2 1 0"
    return [[names[int(i)] for i in part.split()] for part in text.split(",")]


def _mlp(width: int, depth: int) -> torch.nn.Module:
    """``depth`` Linear(width, width) layers with ReLU between them (course_lib.models.MLP)."""
    from course_lib.models import MLP, MLPConfig

    return MLP(MLPConfig(in_features=width, hidden=(width,) * (depth - 1), out_features=width))


def _wrap(implementation: str, model, cap: float, rec: StepRecorder):
    """(wrapped model, function returning the bucket sizes the wrapper reports)."""
    if implementation == "course":
        from course_lib.parallel.ddp import DataParallel

        ddp = DataParallel(model, bucket_cap_mb=cap, recorder=rec)
        sizes = dict((n, p.numel() * p.element_size()) for n, p in model.named_parameters())
        return ddp, lambda: tuple(sum(sizes[n] for n in names) for names in ddp.buckets)
    from torch.nn.parallel import DistributedDataParallel as DDP

    ddp = DDP(model, bucket_cap_mb=cap)
    ddp.register_comm_hook(None, rec.comm_hook)

    def logged():
        data = ddp._get_ddp_logging_data()  # private but stable since 1.9 (DDP's logger)
        sizes = data.get("rebuilt_bucket_sizes") or data.get("bucket_sizes") or ""
        return tuple(int(s) for s in str(sizes).split(",") if s.strip())

    return ddp, logged


def _bucket_worker(
    rank: int,
    world_size: int,
    caps_mb: list[float],
    width: int,
    depth: int,
    batch: int,
    warmup: int,
    steps: int,
    implementations: tuple[str, ...] = ("torch",),
) -> dict:
    """Build a fresh DDP model per cap; count buckets with a comm hook; log a timeline."""
    from course_lib.runtime.device import rank_device

    device = rank_device()
    # The module pre-hook of layer 0 fires although its input x needs no gradient, which is what
    # we want (its output gradient has arrived); torch warns about that case, harmlessly here.
    warnings.filterwarnings("ignore", message="Full backward hook is firing", category=UserWarning)
    out = {"summary": [], "events": {}}
    for implementation, cap in [(i, c) for i in implementations for c in caps_mb]:
        torch.manual_seed(0)
        model = _mlp(width, depth).to(device)
        grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        rec = StepRecorder(rank, world_size, model.layers)
        ddp, logged_sizes = _wrap(implementation, model, cap, rec)

        torch.manual_seed(1 + rank)  # each rank its own data, as in data parallelism
        x = torch.randn(batch, width, device=device)  # (B, width)
        # the same step without DDP (no communication), for the overhead DDP adds; our
        # DataParallel hooks the parameters themselves, so it is told to stay quiet
        local = []
        for step in range(warmup + steps):
            model.zero_grad(set_to_none=True)
            dist.barrier()
            sync(device)
            t0 = time.perf_counter()
            with ddp.no_sync() if implementation == "course" else contextlib.nullcontext():
                model(x).square().mean().backward()
            sync(device)
            if step >= warmup:
                local.append(time.perf_counter() - t0)
        step_times, bwd_times = [], []
        for step in range(warmup + steps):
            model.zero_grad(set_to_none=True)
            rec.new_step()  # keeps only the last step's timeline
            dist.barrier()
            sync(device)
            t0 = time.perf_counter()
            loss = ddp(x).square().mean()
            t_bwd = time.perf_counter()
            loss.backward()  # returns after DDP waited for every bucket's future
            sync(device)
            t1 = time.perf_counter()
            if step >= warmup:
                step_times.append(t1 - t0)
                bwd_times.append(t1 - t_bwd)
        t = torch.tensor([step_times, local], dtype=torch.float64, device=device)  # (2, steps)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        t_ddp, t_local = t.cpu().tolist()
        # parity: our timed hook must leave the gradient DDP's default hook leaves, the mean
        # over ranks of each rank's gradient; recomputed here on one process from every x
        ref = _mlp(width, depth).to(device)
        ref.load_state_dict(model.state_dict())
        for r in range(world_size):
            torch.manual_seed(1 + r)
            x_r = torch.randn(batch, width, device=device)  # (B, width): rank r's batch
            (ref(x_r).square().mean() / world_size).backward()
        grad_err = max(
            float((p.grad - q.grad).abs().max())
            for p, q in zip(model.parameters(), ref.parameters())
        )
        out["summary"].append(
            {
                "implementation": implementation,
                "bucket_cap_mb": cap,
                "n_buckets": len(rec.calls),
                "bucket_bytes": tuple(rec.calls),
                "logged_bucket_bytes": logged_sizes(),
                "grad_bytes": grad_bytes,
                "step_time_s": statistics.median(t_ddp),
                "local_step_time_s": statistics.median(t_local),
                "backward_time_s": statistics.median(bwd_times),
                "grad_max_abs_err": grad_err,
            }
        )
        out["events"][implementation, cap] = rec.log.to_records()
        dist.barrier()
        del ddp
    return out


def ddp_bucket_sweep(
    bucket_caps_mb: Sequence[float] = (1, 2, 4, 25),
    *,
    world_size: int = 2,
    width: int = 512,
    depth: int = 8,
    batch: int = 64,
    warmup: int = 2,
    steps: int = 4,
    implementations: Sequence[str] = ("torch",),
    backend: str = "auto",
    timeout: float = 120.0,
) -> BucketSweep:
    """DDP over ``world_size`` ranks with ``bucket_cap_mb`` swept, for each of
    ``implementations`` ("torch": torch.nn.parallel.DistributedDataParallel, buckets counted by a
    comm hook (``register_comm_hook``) and checked against DDP's own logging data; "course":
    ``parallel.ddp.DataParallel``, buckets counted through its ``recorder``), and a per-rank
    timeline of the last step.

    The model is course_lib.models.MLP with ``depth`` Linear(width, width) layers: (width^2 +
    width) x 4 bytes of fp32 gradient per layer. The first ``warmup`` steps are not timed: DDP rebuilds its buckets after
    the first backward, in the order gradients became ready. Returns a :class:`BucketSweep`.
    """
    from course_lib.measure.timing import merge_event_logs
    from course_lib.runtime.launch import launch

    caps = [validate.number("bucket_caps_mb[i]", c, positive=True) for c in bucket_caps_mb]
    if not caps:
        raise ValueError("bucket_caps_mb must not be empty, e.g. (1, 2, 4, 25)")
    for name, v in (
        ("world_size", world_size),
        ("width", width),
        ("depth", depth),
        ("batch", batch),
        ("steps", steps),
    ):
        validate.count(name, v, minimum=1)
    if world_size < 2:
        raise ValueError(f"world_size={world_size} must be >= 2 (DDP needs peers to reduce with)")
    validate.count("warmup", warmup, minimum=0)
    if isinstance(implementations, str):
        implementations = (implementations,)
    impls = tuple(validate.choices("implementations", implementations, IMPLEMENTATIONS))
    # One launch for every cap: constructing the first DDP in a process imports torch._dynamo
    # (seconds on a small machine), a cost a launch per cap would pay again and again.
    res = launch(
        _bucket_worker,
        world_size,
        caps,
        width,
        depth,
        batch,
        warmup,
        steps,
        impls,
        backend=backend,
        timeout=timeout,
    )
    frames = []
    for impl, cap in [(i, c) for i in impls for c in caps]:  # one clock origin per run: the
        ev = merge_event_logs([r["events"][impl, cap] for r in res])  # step's first event
        frames.append(ev.drop(columns=["meta"]).assign(bucket_cap_mb=cap, implementation=impl))
    events = pd.concat(frames, ignore_index=True)
    return BucketSweep(pd.DataFrame(res[0]["summary"]), events)
