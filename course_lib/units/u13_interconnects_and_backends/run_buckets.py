"""Unit 13: DDP's gradient buckets -- how many, how big, and when backward hides their
all-reduce (notebooks/13_interconnects_and_backends.ipynb). Re-exported by ``run``; the sweep
moves to unit 09 (data parallelism) when that unit exists.
"""
from __future__ import annotations

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
@dataclass(frozen=True)
class BucketSweep:
    """Result of :func:`ddp_bucket_sweep`.

    ``summary``: one row per bucket_cap_mb: n_buckets (comm-hook calls per step),
    bucket_bytes (tuple, in the order they were reduced), logged_bucket_bytes (from DDP's
    ``_get_ddp_logging_data()['rebuilt_bucket_sizes']`` or ``['bucket_sizes']``), grad_bytes,
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
    (buckets only), bucket_cap_mb.
    """

    summary: pd.DataFrame
    events: pd.DataFrame = field(repr=False)


def _mlp(width: int, depth: int) -> torch.nn.Module:
    """``depth`` Linear(width, width) layers with ReLU between them (course_lib.models.MLP)."""
    from course_lib.models import MLP, MLPConfig

    return MLP(MLPConfig(in_features=width, hidden=(width,) * (depth - 1), out_features=width))


def _bucket_worker(rank: int, world_size: int, caps_mb: list[float], width: int, depth: int,
                   batch: int, warmup: int, steps: int) -> dict:
    """Build a fresh DDP model per cap; count buckets with a comm hook; log a timeline."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from course_lib.runtime.device import rank_device

    device = rank_device()
    # The module pre-hook of layer 0 fires although its input x needs no gradient, which is what
    # we want (its output gradient has arrived); torch warns about that case, harmlessly here.
    warnings.filterwarnings("ignore", message="Full backward hook is firing", category=UserWarning)
    out = {"summary": [], "events": {}}
    for cap in caps_mb:
        torch.manual_seed(0)
        model = _mlp(width, depth).to(device)
        grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        ddp = DDP(model, bucket_cap_mb=cap)
        rec = StepRecorder(rank, world_size, model.layers)
        ddp.register_comm_hook(None, rec.comm_hook)

        torch.manual_seed(1 + rank)  # each rank its own data, as in data parallelism
        x = torch.randn(batch, width, device=device)  # (B, width)
        # the same step without DDP (no communication), for the overhead DDP adds
        local = []
        for step in range(warmup + steps):
            model.zero_grad(set_to_none=True)
            dist.barrier()
            sync(device)
            t0 = time.perf_counter()
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
        grad_err = max(float((p.grad - q.grad).abs().max())
                       for p, q in zip(model.parameters(), ref.parameters()))
        logged = ddp._get_ddp_logging_data()  # private but stable since 1.9 (DDP's logger)
        sizes = logged.get("rebuilt_bucket_sizes") or logged.get("bucket_sizes") or ""
        out["summary"].append({
            "bucket_cap_mb": cap, "n_buckets": len(rec.calls), "bucket_bytes": tuple(rec.calls),
            "logged_bucket_bytes": tuple(int(s) for s in str(sizes).split(",") if s.strip()),
            "grad_bytes": grad_bytes, "step_time_s": statistics.median(t_ddp),
            "local_step_time_s": statistics.median(t_local),
            "backward_time_s": statistics.median(bwd_times), "grad_max_abs_err": grad_err})
        out["events"][cap] = rec.log.to_records()
        dist.barrier()
        del ddp
    return out


def ddp_bucket_sweep(bucket_caps_mb: Sequence[float] = (1, 2, 4, 25), *, world_size: int = 2,
                     width: int = 512, depth: int = 8, batch: int = 64, warmup: int = 2,
                     steps: int = 4, backend: str = "auto", timeout: float = 120.0) -> BucketSweep:
    """DDP (torch.nn.parallel.DistributedDataParallel) over ``world_size`` ranks with
    ``bucket_cap_mb`` swept, buckets counted by a comm hook (``register_comm_hook``) and checked
    against DDP's own logging data, and a per-rank timeline of the last step.

    The model is course_lib.models.MLP with ``depth`` Linear(width, width) layers: (width^2 +
    width) x 4 bytes of fp32 gradient per layer. The first ``warmup`` steps are not timed: DDP rebuilds its buckets after
    the first backward, in the order gradients became ready. Returns a :class:`BucketSweep`.
    """
    from course_lib.measure.timing import merge_event_logs
    from course_lib.runtime.launch import launch

    caps = [validate.number("bucket_caps_mb[i]", c, positive=True) for c in bucket_caps_mb]
    if not caps:
        raise ValueError("bucket_caps_mb must not be empty, e.g. (1, 2, 4, 25)")
    for name, v in (("world_size", world_size), ("width", width), ("depth", depth),
                    ("batch", batch), ("steps", steps)):
        validate.count(name, v, minimum=1)
    if world_size < 2:
        raise ValueError(f"world_size={world_size} must be >= 2 (DDP needs peers to reduce with)")
    validate.count("warmup", warmup, minimum=0)
    # One launch for every cap: constructing the first DDP in a process imports torch._dynamo
    # (seconds on a small machine), a cost a launch per cap would pay again and again.
    res = launch(_bucket_worker, world_size, caps, width, depth, batch, warmup, steps,
                 backend=backend, timeout=timeout)
    frames = []
    for cap in caps:  # one clock origin per cap: the earliest event of that step on any rank
        ev = merge_event_logs([r["events"][cap] for r in res])
        frames.append(ev.drop(columns=["meta"]).assign(bucket_cap_mb=cap))
    events = pd.concat(frames, ignore_index=True)
    return BucketSweep(pd.DataFrame(res[0]["summary"]), events)
