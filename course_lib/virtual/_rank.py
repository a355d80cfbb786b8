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
import math
import os
import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

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


# ------------------------------------------------------------------------ fast sharding metadata
class _LazyChunks(Sequence):
    """``torch.chunk(t, n, dim)`` padded with empty tensors to ``n`` entries (what FSDP2's
    ``_chunk_with_empty`` returns), with each chunk made only when indexed.

    FSDP2 builds all ``world_size`` chunks of every parameter to keep one (``chunks[rank]``) and
    read one size (``chunks[0]``). Under FakeTensorMode each chunk is a fake tensor costing
    ~0.1 ms: at 512 ranks and 720 parameters that was 25 of 40 seconds. Same views, same order.
    """

    def __init__(self, tensor: torch.Tensor, num_chunks: int, dim: int):
        self.tensor, self.n, self.dim = tensor, num_chunks, dim
        size = tensor.size(dim)
        self.step = math.ceil(size / num_chunks)
        self.real = math.ceil(size / self.step)  # torch.chunk may return fewer than n chunks

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self.n))]
        if i < 0:
            i += self.n
        if not 0 <= i < self.n:
            raise IndexError(i)
        if i < self.real:
            start = i * self.step
            return self.tensor.narrow(
                self.dim, start, min(self.step, self.tensor.size(self.dim) - start)
            )
        return self[0].new_empty(0)


def lazy_chunk_with_empty(tensor: torch.Tensor, num_chunks: int, dim: int):
    if tensor.size(dim) == 0 or num_chunks <= 1:
        return list(torch.chunk(tensor, num_chunks, dim=dim)) or [tensor.new_empty(0)]
    return _LazyChunks(tensor, num_chunks, dim)


@contextlib.contextmanager
def meshes_outside_fake():
    """Let FSDP2 build its 2-D (dp, tp) mesh while FakeTensorMode is active.

    ``fully_shard`` on a tensor-parallel module concatenates the dp and tp meshes
    (``DeviceMesh._concatenate``, in ``FSDPParam._init_sharding_spec_tp``), and a new
    ``DeviceMesh`` finds its own coordinates with ``(mesh == rank).nonzero()``: under
    FakeTensorMode ``nonzero`` has no static output shape and raises
    ``DynamicOutputShapeException``. The mesh is bookkeeping on a tiny real tensor of rank ids,
    so it is built with fake mode switched off (``unset_fake_temporarily``); parameters,
    gradients and optimizer states stay fake.
    """
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.distributed.device_mesh import DeviceMesh

    original = DeviceMesh._concatenate

    def concatenate(device_mesh_list):
        with unset_fake_temporarily():
            return original(device_mesh_list)

    DeviceMesh._concatenate = staticmethod(concatenate)
    try:
        yield
    finally:
        DeviceMesh._concatenate = staticmethod(original)


@contextlib.contextmanager
def fast_fsdp_chunks():
    """Use :func:`lazy_chunk_with_empty` inside FSDP2 while the block runs (restored after)."""
    from torch.distributed.fsdp._fully_shard import _fsdp_param

    original = _fsdp_param._chunk_with_empty
    _fsdp_param._chunk_with_empty = lazy_chunk_with_empty
    try:
        yield
    finally:
        _fsdp_param._chunk_with_empty = original


#: the tracker categories that make the activation peak: tensors made in forward (and rebuilt
#: by checkpointing) and backward's scratch (activation gradients)
_ACTIVATION_KINDS = ("Activation", "Temp")


def _global_peak_only(tracker_cls):
    """``tracker_cls`` whose per-operator peak update keeps only the global peak.

    MemTracker, after every operator, walks every module it knows to update the peaks of the
    active ones and deep-copies the snapshot at each new peak: O(modules) per operator, so
    O(layers^2) per step (~10 % of a 70B step). We read per-module states only at their
    pre/post forward/backward hooks, which it still records; the global peak stays exact.
    It also keeps the peak of activations + temporaries (``activation_peak_bytes``), which
    need not fall at the moment of the total's peak.
    """
    from torch.distributed._tools.mem_tracker import _TOTAL_KEY

    class Tracker(tracker_cls):
        #: largest activations + temporaries seen so far, and the snapshot at that moment
        activation_peak_bytes = 0
        activation_peak_snap: dict = {}

        def _update_peak_stats(self, peak_state) -> None:
            for dev, snap in self._curr_mem_snap.items():
                if self._peak_mem.get(dev, 0) < snap[_TOTAL_KEY]:
                    self._peak_mem[dev] = snap[_TOTAL_KEY]
                    self._peak_mem_snap[dev] = dict(snap)  # values are ints: a copy suffices
                act = sum(v for k, v in snap.items() if getattr(k, "value", k) in _ACTIVATION_KINDS)
                if act > self.activation_peak_bytes:
                    self.activation_peak_bytes = act
                    self.activation_peak_snap = {dev: dict(snap)}

    Tracker.__name__ = tracker_cls.__name__
    return Tracker


# ------------------------------------------------------------------------ set-up
def _init_fake_group(world_size: int) -> None:
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():  # course_lib.launch made a real 1-rank group: replace it
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)


def _blocks(model: nn.Module) -> list[nn.Module]:
    layers = getattr(model, "layers", None)
    return list(layers) if isinstance(layers, nn.ModuleList) else []


def _tp_plan(model: nn.Module) -> dict:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    # Megatron split (Shoeybi et al. 2019): column-parallel in, row-parallel out, so each
    # attention and each MLP needs one all-reduce forward (after wo / w2) and one backward.
    return {
        "wq": ColwiseParallel(),
        "wk": ColwiseParallel(),
        "wv": ColwiseParallel(),
        "wo": RowwiseParallel(),
        "w1": ColwiseParallel(),
        "w3": ColwiseParallel(),
        "w2": RowwiseParallel(),
    }


def _build(spec: dict, mesh) -> tuple[nn.Module, Any]:
    """Model with the strategy's wrappers applied; returns (model, autocast context or None)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    strategy, mp = spec["strategy"], spec["mixed_precision"]
    model = spec["model_fn"]()
    if not isinstance(model, nn.Module):
        raise TypeError(f"model_fn() returned {type(model).__name__}: expected a torch.nn.Module")
    param_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(mp)
    policy = MixedPrecisionPolicy(
        param_dtype=param_dtype, reduce_dtype=torch.float32 if mp else None
    )
    autocast = None
    if strategy in ("tp", "fsdp+tp"):
        from torch.distributed.tensor.parallel import parallelize_module

        tp_mesh = mesh["tp"] if strategy == "fsdp+tp" else mesh
        for block in _blocks(model):
            parallelize_module(block, tp_mesh, _tp_plan(block))
    # torchtitan's order: tensor parallelism, then checkpointing, then FSDP (which shards the
    # checkpoint wrappers)
    _apply_checkpointing(model, spec.get("checkpoint"))
    if strategy in ("fsdp", "fsdp_no_reshard", "fsdp+tp"):
        dp_mesh = mesh["dp"] if strategy == "fsdp+tp" else mesh
        reshard = spec["reshard_after_forward"] and strategy != "fsdp_no_reshard"
        for block in _blocks(model):
            fully_shard(block, mesh=dp_mesh, mp_policy=policy, reshard_after_forward=reshard)
        fully_shard(model, mesh=dp_mesh, mp_policy=policy, reshard_after_forward=reshard)
    elif strategy == "ddp":
        from torch.distributed._composable.replicate_with_fsdp import replicate

        for block in _blocks(model):
            replicate(block, mesh=mesh, mp_policy=policy)
        replicate(model, mesh=mesh, mp_policy=policy)
    elif param_dtype is not None:  # tp: no FSDP policy to cast with; autocast does it per op
        autocast = param_dtype
    return model, autocast


#: aten ops whose outputs the "selective" policy keeps (torchtitan's op-level list: the matmuls
#: and the fused attention, whose CPU kernel is the flash one; everything else is recomputed)
SELECTIVE_SAVE = (
    "mm",
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention",
)


def _selective_context():
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    keep = {getattr(torch.ops.aten, n) for n in SELECTIVE_SAVE if hasattr(torch.ops.aten, n)}

    def policy(ctx, op, *args, **kwargs):
        return (
            CheckpointPolicy.MUST_SAVE
            if op.overloadpacket in keep
            else CheckpointPolicy.PREFER_RECOMPUTE
        )

    return create_selective_checkpoint_contexts(policy)


def _apply_checkpointing(model: nn.Module, policy: str | None) -> None:
    """Wrap every block of ``model.layers`` in ``checkpoint_wrapper`` (non-reentrant
    ``torch.utils.checkpoint``, what torchtitan's ``apply_ac`` uses); None: nothing.

    ``full``: a block keeps only its inputs and runs its forward again in backward.
    ``selective``: the outputs of :data:`SELECTIVE_SAVE` are kept too, the rest is recomputed.

    Applied before ``fully_shard`` / ``replicate``, which then wrap the checkpoint wrappers (as
    torchtitan does). The rebuilt tensors exist during backward, where the trackers file them
    under temporaries (FSDPMemTracker files them as activations only when the recomputation
    enters an FSDP module's pre-forward, i.e. with the wrapper around a sharded block: same
    bytes, same collectives); ``activation_peak_bytes`` counts both categories.
    """
    if policy is None:
        return
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl,
        checkpoint_wrapper,
    )

    layers = getattr(model, "layers", None)
    if not isinstance(layers, nn.ModuleList) or not len(layers):
        raise TypeError(
            f"checkpoint = {policy!r}: expected a model with a ModuleList "
            f"model.layers of blocks to checkpoint; {type(model).__name__} has none"
        )
    extra = {"context_fn": _selective_context} if policy == "selective" else {}
    for i, block in enumerate(layers):
        layers[i] = checkpoint_wrapper(
            block, checkpoint_impl=CheckpointImpl.NO_REENTRANT, preserve_rng_state=False, **extra
        )


def _optimizer(name: str, params) -> torch.optim.Optimizer:
    # foreach kernels refuse a list that mixes DTensors (tensor-parallel weights) with plain
    # tensors (replicated norms and embeddings): one parameter group for each kind
    params = list(params)
    dtensors = [p for p in params if hasattr(p, "to_local")]
    plain = [p for p in params if not hasattr(p, "to_local")]
    params = [{"params": g} for g in (dtensors, plain) if g]
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-4, foreach=True)
    if name == "adam":
        return torch.optim.Adam(params, lr=1e-4, foreach=True)
    return torch.optim.SGD(params, lr=1e-2, foreach=True)


def _prime_optimizer(opt: torch.optim.Optimizer) -> None:
    """Create the optimizer state before the measured step, as on any step after the first.

    torch.optim makes Adam's state lazily in the first ``step()``, so without this the measured
    step's backward peak would miss 8 B/param. We make exactly what ``Adam._init_group`` makes
    for a non-fused, non-capturable Adam: ``step`` (a 0-dim fp32 tensor), ``exp_avg`` and
    ``exp_avg_sq`` (``zeros_like`` the parameter: a DTensor shard under FSDP/TP), so the step
    finds its state and creates none (tests check the total: 2 x params + 4 B per tensor).
    A priming ``step()`` on zero gradients would do the same at ~5x the cost under DTensor.
    SGD without momentum keeps no state.
    """
    if not isinstance(opt, torch.optim.Adam | torch.optim.AdamW):
        return
    with torch.no_grad():
        for group in opt.param_groups:
            for p in group["params"]:
                opt.state[p] = {
                    "step": torch.tensor(0.0, dtype=torch.float32),
                    "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                    "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format),
                }


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
def simulate_in_process(spec: dict) -> dict:
    """Build, wrap, and trace one training step as rank 0 of ``spec["world_size"]`` ranks."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.debug import CommDebugMode

    t0 = time.process_time()
    world, tp, strategy = spec["world_size"], spec["tp"], spec["strategy"]
    _init_fake_group(world)
    # the mesh first: init_device_mesh inside FakeTensorMode raises DataDependentOutputException
    if strategy == "fsdp+tp":
        mesh = init_device_mesh("cpu", (world // tp, tp), mesh_dim_names=("dp", "tp"))
    else:
        mesh = init_device_mesh("cpu", (world,))
    fsdp_like = strategy in ("fsdp", "fsdp_no_reshard", "fsdp+tp", "ddp")
    with (
        FakeTensorMode(allow_non_fake_inputs=True),
        meshes_outside_fake(),
        fast_fsdp_chunks() if spec["fast_chunks"] else contextlib.nullcontext(),
    ):
        model, autocast_dtype = _build(spec, mesh)
        n_params_local = sum(
            p.to_local().numel() if hasattr(p, "to_local") else p.numel()
            for p in model.parameters()
        )
        opt = _optimizer(spec["optimizer"], model.parameters())
        _prime_optimizer(opt)
        vocab = spec["vocab"]
        idx = torch.randint(0, vocab, (spec["batch"], spec["seq_len"]))  # (B, T)
        tracker_cls = _global_peak_only(FSDPMemTracker if fsdp_like else MemTracker)
        tracker = tracker_cls(model, opt) if fsdp_like else tracker_cls()
        if not fsdp_like:
            tracker.track_external(model, opt)
        tracker.track_inputs((idx,)) if fsdp_like else None
        comm = CommDebugMode() if spec.get("count_comm", True) else contextlib.nullcontext()
        t_setup = time.process_time()
        autocast = (
            torch.autocast("cpu", dtype=autocast_dtype)
            if autocast_dtype is not None
            else contextlib.nullcontext()
        )
        with comm, tracker:
            with autocast:
                logits = model(idx)  # (B, T, v)
            after_forward = _snap(tracker, "current")
            loss = F.cross_entropy(logits.flatten(0, 1).float(), idx.flatten())
            del logits  # a training loop keeps only the loss
            t_forward = time.process_time()
            loss.backward()
            del loss
            after_backward = _snap(tracker, "current")
            # the peak of forward + backward; the optimizer step's own peak is kept apart: on
            # DTensor parameters under FakeTensorMode, DTensor's sharding propagation runs its
            # global-shape meta computations in our fake mode, and the tracker counts them as
            # the step's temporaries (~12 B per *global* parameter for foreach AdamW), which
            # no GPU would allocate
            peak = _snap(tracker, "peak")
            act_peak = {}
            for per_device in tracker.activation_peak_snap.values():
                _add(act_peak, per_device)
            t_backward = time.process_time()
            opt.step()
            after_step = _snap(tracker, "current")
            opt.zero_grad(set_to_none=True)
            t_step = time.process_time()
        step_peak = _snap(tracker, "peak")
        maxima = _module_maxima(tracker)
    for snap in (after_forward, after_backward, after_step):  # maxima also over our own snapshots
        for k, v in snap.items():
            maxima[k] = max(maxima.get(k, 0), v)
    maxima["total"] = max(maxima.get("total", 0), peak.get("total", 0))
    maxima["optimizer"] = after_step.get("optimizer", 0)  # state only; see step_peak above
    wall = time.process_time() - t0  # CPU seconds of this process
    return {
        "at_peak": peak,
        "max": maxima,
        "after_forward": after_forward,
        "after_backward": after_backward,
        "after_step": after_step,
        "step_peak_total": step_peak.get("total", 0),
        "activation_peak": act_peak,
        "comm": _comm_counts(comm) if spec.get("count_comm", True) else None,
        "n_params_local": int(n_params_local),
        "phases_s": {
            "setup": t_setup - t0,
            "forward": t_forward - t_setup,
            "backward": t_backward - t_forward,
            "step": t_step - t_backward,
        },
        "wall_s": wall,
        "rss_peak_bytes": _peak_rss_bytes(),
        "pid": os.getpid(),
        "torch": torch.__version__,
    }


def rank_entry(rank: int, world_size: int, spec: dict) -> dict:
    """What ``course_lib.launch(rank_entry, 1, spec)`` runs: the real 1-rank group is replaced
    by the fake one, and torn down again when the launch ends."""
    try:
        return simulate_in_process(spec)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
