"""What runs inside the one process of a virtual-cluster simulation (see ``simulate.py``).

The process plays rank 0 of ``world_size`` ranks: a *fake* process group (every collective
returns at once, moving nothing), a device mesh built BEFORE ``FakeTensorMode`` is entered
(inside it, ``init_device_mesh`` fails), then the model, the parallel wrappers, the optimizer
and one training step under ``FakeTensorMode``: every tensor has a shape, a dtype and a device
but no storage, so a 70B model costs a few hundred MB of host memory. PyTorch's own memory
trackers (``FSDPMemTracker`` for FSDP2, ``MemTracker`` otherwise) count the bytes the tensors
*would* take on a real rank, and ``CommDebugMode`` counts the collectives.

Everything returned is plain data (ints, strings, dicts), so it travels back by pickle.
Introduced in notebooks/10_zero_fsdp.ipynb.
"""

from __future__ import annotations

import contextlib
import os
import time
import warnings
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from course_lib.dims import ParallelDims
from course_lib.virtual._build import build, make_optimizer, prime_optimizer
from course_lib.virtual._patches import fast_fsdp_chunks, global_peak_only, meshes_outside_fake
from course_lib.virtual._types import SimSpec, StepResult

#: tracker category name -> our row name (FSDPMemTracker's names, then MemTracker's)
CATEGORY_OF = {
    "Sharded Param": "params",
    "Parameter": "params",
    "Unsharded Param": "unsharded_params",
    "Buffer": "buffers",
    "Sharded Grad": "grads",
    "Gradient": "grads",
    "Unsharded Grad": "unsharded_grads",
    "OptState": "optimizer",
    "Optstate": "optimizer",
    "Activation": "activations",
    "Temp": "temporaries",
    "All Gather": "all_gather",
    "Reduce Scatter": "reduce_scatter",
    "Inputs": "inputs",
    "Input": "inputs",
    "Total": "total",
}


# ------------------------------------------------------------------------ set-up
def _init_fake_group(world_size: int) -> None:
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():  # course_lib.launch made a real 1-rank group: replace it
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)


def _snap(tracker, kind: str) -> dict[str, int]:
    """One tracker snapshot as {row name: bytes}, summed over devices."""
    out: dict[str, int] = {}
    for per_device in tracker.get_tracker_snapshot(kind).values():
        _add(out, per_device)
    return out


def _add(out: dict[str, int], per_device: dict) -> None:
    for key, value in per_device.items():
        name = CATEGORY_OF.get(getattr(key, "value", key), str(getattr(key, "value", key)))
        out[name] = out.get(name, 0) + int(value)


def _module_maxima(tracker) -> dict[str, int]:
    """Per-category maximum over every snapshot the tracker took (each module's pre/post
    forward/backward and its own peaks): the largest each category got at those moments."""
    best: dict[str, int] = {}
    for stats in tracker.memory_tracking.values():
        for snaps in stats.snapshots.values():
            for snap in snaps:
                one: dict[str, int] = {}
                for per_device in snap.values():
                    _add(one, per_device)
                for k, v in one.items():
                    best[k] = max(best.get(k, 0), v)
    return best


def _comm_counts(mode) -> dict[str, Any]:
    def clean(counts: dict) -> dict[str, int]:
        return {str(getattr(op, "__name__", op)).split(".")[-1]: int(n) for op, n in counts.items()}

    out: dict[str, Any] = {"total": clean(mode.get_comm_counts())}
    glob = getattr(mode, "comm_module_counts", {}).get("Global", {})
    for phase in ("forward", "backward"):
        if phase in glob:
            out[phase] = clean(glob[phase])
    return out


def _peak_rss_bytes() -> int:
    """Peak resident memory of this process (VmHWM, reset at fork), else current RSS."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import psutil

    return psutil.Process().memory_info().rss


# ------------------------------------------------------------------------ one simulated step
def _mesh(spec: SimSpec) -> Any:
    """The device mesh, made before FakeTensorMode (inside it init_device_mesh raises)."""
    from torch.distributed.device_mesh import init_device_mesh

    world, tp = spec.world_size, spec.tp
    if spec.strategy == "fsdp+tp":  # dp x tp, rank order from ParallelDims (tp innermost)
        dims, keep = ParallelDims(dp=world // tp, tp=tp), ("dp", "tp")
        return init_device_mesh("cpu", dims.mesh_shape(keep), mesh_dim_names=dims.mesh_axes(keep))
    return init_device_mesh("cpu", (world,))


def _tracker(
    model: nn.Module, opt: torch.optim.Optimizer, fsdp_like: bool, idx: torch.Tensor
) -> Any:
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import MemTracker

    tracker_cls = global_peak_only(FSDPMemTracker if fsdp_like else MemTracker)
    if fsdp_like:
        tracker = tracker_cls(model, opt)
        tracker.track_inputs((idx,))
    else:
        tracker = tracker_cls()
        tracker.track_external(model, opt)
    return tracker


def _trace_step(
    model: nn.Module,
    opt: torch.optim.Optimizer,
    tracker: Any,
    idx: torch.Tensor,
    autocast_dtype: torch.dtype | None,
) -> tuple[dict[str, dict[str, int]], list[float]]:
    """One forward, backward and optimizer step under the tracker: the snapshots taken, and
    the process time after forward, backward and step."""
    autocast = (
        torch.autocast("cpu", dtype=autocast_dtype)
        if autocast_dtype is not None
        else contextlib.nullcontext()
    )
    snaps: dict[str, dict[str, int]] = {}
    with autocast:
        logits = model(idx)  # (B, T, v)
    snaps["after_forward"] = _snap(tracker, "current")
    loss = F.cross_entropy(logits.flatten(0, 1).float(), idx.flatten())
    del logits  # a training loop keeps only the loss
    times = [time.process_time()]
    with warnings.catch_warnings():
        # the trackers' module hooks see outputs whose inputs (token ids) need no gradient
        warnings.filterwarnings("ignore", message="Full backward hook is firing")
        loss.backward()
    del loss
    snaps["after_backward"] = _snap(tracker, "current")
    # the peak of forward + backward; the optimizer step's own peak is kept apart: on DTensor
    # parameters under FakeTensorMode, DTensor's sharding propagation runs its global-shape meta
    # computations in our fake mode, and the tracker counts them as the step's temporaries
    # (~12 B per *global* parameter for foreach AdamW), which no GPU would allocate
    snaps["at_peak"] = _snap(tracker, "peak")
    act_peak: dict[str, int] = {}
    for per_device in tracker.activation_peak_snap.values():
        _add(act_peak, per_device)
    snaps["activation_peak"] = act_peak
    times.append(time.process_time())
    opt.step()
    snaps["after_step"] = _snap(tracker, "current")
    opt.zero_grad(set_to_none=True)
    times.append(time.process_time())
    return snaps, times


def _all_maxima(tracker: Any, snaps: dict[str, dict[str, int]]) -> dict[str, int]:
    maxima = _module_maxima(tracker)
    for name in ("after_forward", "after_backward", "after_step"):  # also over our snapshots
        for k, v in snaps[name].items():
            maxima[k] = max(maxima.get(k, 0), v)
    maxima["total"] = max(maxima.get("total", 0), snaps["at_peak"].get("total", 0))
    maxima["optimizer"] = snaps["after_step"].get("optimizer", 0)  # state only: see _trace_step
    return maxima


def _local(p: torch.Tensor) -> torch.Tensor:
    """This rank's part of a parameter (a DTensor's local shard)."""
    return p.to_local() if hasattr(p, "to_local") else p


def simulate_in_process(spec: SimSpec) -> StepResult:
    """Build, wrap, and trace one training step as rank 0 of ``spec.world_size`` ranks."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed.tensor.debug import CommDebugMode

    t0 = time.process_time()
    _init_fake_group(spec.world_size)
    mesh = _mesh(spec)
    fsdp_like = spec.strategy in ("fsdp", "fsdp_no_reshard", "fsdp+tp", "ddp")
    with (
        FakeTensorMode(allow_non_fake_inputs=True),
        meshes_outside_fake(),
        fast_fsdp_chunks() if spec.fast_chunks else contextlib.nullcontext(),
    ):
        model, autocast_dtype = build(spec, mesh)
        n_params_local = sum(_local(p).numel() for p in model.parameters())
        opt = make_optimizer(spec.optimizer, model.parameters())
        prime_optimizer(opt)
        idx = torch.randint(0, spec.vocab, (spec.batch, spec.seq))  # (B, T)
        tracker = _tracker(model, opt, fsdp_like, idx)
        comm = CommDebugMode() if spec.count_comm else contextlib.nullcontext()
        t_setup = time.process_time()
        with comm, tracker:
            snaps, (t_forward, t_backward, t_step) = _trace_step(
                model, opt, tracker, idx, autocast_dtype
            )
        step_peak = _snap(tracker, "peak")
        maxima = _all_maxima(tracker, snaps)
    return StepResult(
        at_peak=snaps["at_peak"],
        max=maxima,
        after_forward=snaps["after_forward"],
        after_backward=snaps["after_backward"],
        after_step=snaps["after_step"],
        step_peak_total=step_peak.get("total", 0),
        activation_peak=snaps["activation_peak"],
        comm=_comm_counts(comm) if spec.count_comm else None,
        n_params_local=int(n_params_local),
        phases_s={
            "setup": t_setup - t0,
            "forward": t_forward - t_setup,
            "backward": t_backward - t_forward,
            "step": t_step - t_backward,
        },
        wall_s=time.process_time() - t0,  # CPU seconds of this process
        rss_peak_bytes=_peak_rss_bytes(),
        pid=os.getpid(),
        torch=torch.__version__,
    )


def rank_entry(rank: int, world_size: int, spec: SimSpec) -> StepResult:
    """What ``course_lib.launch(rank_entry, 1, spec)`` runs: the real 1-rank group is replaced
    by the fake one, and torn down again when the launch ends."""
    try:
        return simulate_in_process(spec)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
