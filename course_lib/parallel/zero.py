"""ZeRO from scratch: data parallelism that shards the model state instead of replicating it.
Introduced in notebooks/10_zero_fsdp.ipynb.

Plain data parallelism (unit 09) keeps on every rank the parameters, the gradients and the
optimizer state: with Adam in fp32 that is 4 + 4 + 8 = 16 bytes per parameter, N times over.
ZeRO (Rajbhandari et al. 2019, "ZeRO: Memory Optimizations Toward Training Trillion Parameter
Models", arXiv:1910.02054, Sec. 5) notices that each rank only needs *its slice* of the optimizer
state to update *its slice* of the parameters, and goes in three stages:

* stage 1 (P_os) shards the optimizer state: after backward, a **reduce-scatter** leaves rank r
  the averaged gradient of its slice; r updates that slice; an **all-gather** of the updated
  slices gives every rank the full new parameters. Reduce-scatter + all-gather move exactly what
  DDP's all-reduce moves, 2(N-1)/N x Psi elements per rank;
* stage 2 (P_os+g) also shards the gradients: each layer's gradients are reduce-scattered as soon
  as backward has produced them, and the full gradients are freed; the same bytes as stage 1;
* stage 3 (P_os+g+p, what PyTorch calls FSDP) also shards the parameters: a layer's parameters
  are all-gathered just before its forward and freed after it, gathered *again* before its
  backward, and freed once its gradients are reduce-scattered: 3(N-1)/N x Psi per rank, 1.5x DDP.
  ``reshard_after_forward=False`` keeps the gathered parameters from forward to backward (one
  all-gather fewer, the full parameters of every layer alive at the end of forward: torch's
  ``fully_shard(reshard_after_forward=False)``); ``prefetch=True`` issues the next layer's
  all-gather asynchronously while the current layer computes.

Stage 0 is plain data parallelism (one all-reduce per parameter tensor in ``step()``), for
comparison.

Layout. Every module that directly owns parameters (a Linear, a LayerNorm...) is a *unit*. A
unit's parameters are laid end to end in one flat tensor of Psi_u elements, padded with zeros to
N x s elements, s = ceil(Psi_u / N), so that it cuts into N equal shards; rank r owns elements
[r s, (r+1) s). Padding costs at most N-1 elements per unit (it is what ``estimate.zero_padding``
counts). Stages 1 and 2 keep the full flat tensor on every rank (the module's parameters are views
of it, and so is the optimizer's shard); stage 3 keeps only the shard and gathers the rest on
demand.

What we leave out (DeepSpeed / torch's FSDP2 have it): mixed precision (bf16 compute copies of an
fp32 master shard), overlapping the reduce-scatter with backward (ours is synchronous, in the
hook), buckets spanning several layers, CPU offload, and recording the forward order of the first
step (our prefetch assumes units run in registration order, true of ``nn.Sequential``-like
models), and modules called more than once per forward (shared weights) at stage 3.

Reduce-scatter on gloo. gloo's ``reduce_scatter`` sends what an all-reduce sends, 2(N-1)/N x S
per rank, twice the ring's (N-1)/N x S (measured: torch's ``fully_shard``, which uses it, puts 2x
DDP's bytes on the wire per step instead of 1.5x; notebooks/10_zero_fsdp.ipynb, section 5). So on
gloo we reduce-scatter with the course's ring (``collectives.ring_reduce_scatter``, unit 08), and
with torch's on other backends (NCCL's is a ring).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from course_lib import validate
from course_lib.parallel.collectives import ring_reduce_scatter
from course_lib.parallel.ddp import _group_facts, broadcast_parameters
from course_lib.runtime.compat import all_gather_single, reduce_scatter_single

__all__ = ["ZeroDataParallel", "STAGES", "full_tensors", "shard_numel"]

STAGES = (0, 1, 2, 3)


def shard_numel(numel: int, world_size: int) -> int:
    """Elements of one rank's shard of a unit of ``numel`` elements: ceil(numel / N)."""
    return -(-numel // world_size)


@dataclass
class _Unit:
    """One module's parameters as one flat, padded tensor cut into N shards."""

    module: nn.Module
    prefix: str  # the module's name in the wrapped model ("" for the root)
    names: list[str]  # its own parameters' names (no prefix)
    shapes: list[torch.Size]
    numel: int  # Psi_u, without padding
    shard: nn.Parameter  # (s,) this rank's slice; what the optimizer updates
    flat: torch.Tensor | None = None  # (N*s,) the full parameters, when present
    pending: object = None  # an async all-gather's Work (prefetch)
    arrived: int = 0  # stage 2: gradients produced by this backward
    backward_started: bool = False  # stage 3: the unit's gather for backward is issued
    t_launch: int = 0  # timeline: when the pending all-gather was launched
    offsets: list[int] = field(default_factory=list)

    def views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """The unit's parameters as views of ``flat`` (N*s,), in their shapes."""
        return [flat[o : o + s.numel()].view(s) for o, s in zip(self.offsets, self.shapes)]


class ZeroDataParallel(nn.Module):
    """Wrap ``module`` for ZeRO stage ``stage`` (0-3) over ``group`` (default: all ranks).

    Use it as its own optimizer: ``loss = model(x)...; loss.backward(); model.step();
    model.zero_grad()``. ``optimizer`` (default ``torch.optim.AdamW``) is built with
    ``optimizer_kwargs`` over this rank's shards (over the whole model at stage 0); any
    elementwise optimizer works (Adam, AdamW, SGD, ...): the shard of its update is the update of
    its shard. Parameters and buffers are broadcast from the group's rank 0 at construction.

    Stage 3 only: ``reshard_after_forward`` (free gathered parameters after forward and gather
    them again for backward), ``prefetch`` (launch the next unit's all-gather before running the
    current one). ``log``: optional ``measure.timing.EventLog``; spans "all-gather <unit>",
    "forward <unit>", "backward <unit>", "reduce-scatter <unit>" on lanes "comm"/"compute".
    """

    def __init__(
        self,
        module: nn.Module,
        *,
        stage: int,
        optimizer=torch.optim.AdamW,
        group=None,
        reshard_after_forward: bool = True,
        prefetch: bool = False,
        log=None,
        **optimizer_kwargs,
    ) -> None:
        super().__init__()
        if not isinstance(module, nn.Module):
            raise TypeError(f"module = {validate.describe(module)}: expected a torch.nn.Module")
        if isinstance(stage, bool):
            raise TypeError(f"stage = {stage!r}: expected one of 0, 1, 2, 3 (an int)")
        self.stage = validate.choice("stage", stage, STAGES)
        if not (isinstance(optimizer, type) and issubclass(optimizer, torch.optim.Optimizer)):
            raise TypeError(
                f"optimizer = {validate.describe(optimizer)}: expected a "
                "torch.optim.Optimizer class, e.g. torch.optim.AdamW"
            )
        for name, flag in (
            ("reshard_after_forward", reshard_after_forward),
            ("prefetch", prefetch),
        ):
            validate.choice(name, flag, (True, False))
        if stage != 3 and (prefetch or not reshard_after_forward):
            raise ValueError(
                f"stage = {stage}: prefetch and reshard_after_forward concern stage 3 "
                "(parameters gathered per layer); expected stage = 3 or the defaults"
            )
        params = [p for p in module.parameters()]
        if not params or not all(p.requires_grad for p in params):
            raise ValueError(
                "module: expected parameters that all require a gradient (freeze "
                "nothing under ZeroDataParallel)"
            )
        kinds = {(p.dtype, p.device) for p in params}
        if len(kinds) > 1:
            raise ValueError(
                f"parameters have dtypes/devices {sorted(map(str, kinds))}: expected "
                "one (a unit is one flat tensor); cast the module first"
            )
        self.module, self.group, self.log = module, group, log
        self.reshard_after_forward, self.prefetch = reshard_after_forward, prefetch
        self.world_size, _ = _group_facts(group)
        self.rank = dist.get_rank(group)
        broadcast_parameters(module, group)  # every rank starts from rank 0's model
        self.units: list[_Unit] = []
        self._shards = nn.ParameterList()  # registered, so MemoryMeter counts them as parameters
        if stage == 0:
            self.optimizer = optimizer(module.parameters(), **optimizer_kwargs)
            return
        for prefix, sub in module.named_modules():
            if any(True for _ in sub.parameters(recurse=False)):
                self.units.append(self._make_unit(prefix, sub))
        self.optimizer = optimizer([u.shard for u in self.units], **optimizer_kwargs)
        if stage == 2:
            for u in self.units:
                for p in [getattr(u.module, n) for n in u.names]:
                    p.register_post_accumulate_grad_hook(lambda p, u=u: self._grad_ready(u))
        if stage == 3:
            self._by_storage: dict[int, _Unit] = {}  # storage address of a gathered flat -> unit
            for i, u in enumerate(self.units):
                u.module.register_forward_pre_hook(lambda m, args, i=i: self._pre_forward(i))
                u.module.register_forward_hook(lambda m, args, out, i=i: self._post_forward(i, out))

    # ---- layout -------------------------------------------------------------------------------
    @torch.no_grad()
    def _make_unit(self, prefix: str, sub: nn.Module) -> _Unit:
        own = list(sub.named_parameters(recurse=False))
        numel = sum(p.numel() for _, p in own)
        s = shard_numel(numel, self.world_size)
        p0 = own[0][1]
        flat = torch.zeros(self.world_size * s, dtype=p0.dtype, device=p0.device)  # (N*s,) padded
        offsets = [0]
        for _, p in own:
            offsets.append(offsets[-1] + p.numel())
        unit = _Unit(
            sub,
            prefix,
            [n for n, _ in own],
            [p.shape for _, p in own],
            numel,
            shard=None,
            offsets=offsets[:-1],
        )
        for view, (_, p) in zip(unit.views(flat), own):
            view.copy_(p)
        mine = flat[self.rank * s : (self.rank + 1) * s]  # (s,) this rank's slice
        if self.stage in (1, 2):  # full parameters stay: module params and shard are views of flat
            unit.flat = flat
            unit.shard = nn.Parameter(mine)
            for name, view in zip(unit.names, unit.views(flat)):
                setattr(sub, name, nn.Parameter(view))
        else:  # stage 3: keep the shard only; the module's weights become plain attributes
            unit.shard = nn.Parameter(mine.clone())
            for name in unit.names:
                delattr(sub, name)
                setattr(sub, name, None)
        self._shards.append(unit.shard)
        return unit

    # ---- communication ----------------------------------------------------------------------
    def _reduce_scatter_mean(self, flat_grad: torch.Tensor, name: str) -> torch.Tensor:
        """(N*s,) local gradients -> (s,) this rank's slice of their mean over ranks."""
        out = torch.empty(
            flat_grad.numel() // self.world_size, dtype=flat_grad.dtype, device=flat_grad.device
        )
        start = self._now()
        if dist.get_backend(self.group) == "gloo":
            ring_reduce_scatter(out, flat_grad, self.group)  # see the module docstring
        else:
            reduce_scatter_single(out, flat_grad, group=self.group)
        self._span(
            f"reduce-scatter {name}",
            start,
            "comm",
            bytes=flat_grad.numel() * flat_grad.element_size(),
        )
        return out.div_(self.world_size)

    def _all_gather(self, unit: _Unit, *, wait: bool = True) -> None:
        """Start (or finish) filling ``unit.flat`` (N*s,) with every rank's shard."""
        if unit.flat is None:
            unit.flat = torch.empty(
                self.world_size * unit.shard.numel(),
                dtype=unit.shard.dtype,
                device=unit.shard.device,
            )
            unit.t_launch = self._now()
            unit.pending = all_gather_single(
                unit.flat, unit.shard.detach(), group=self.group, async_op=True
            )
        if wait and unit.pending is not None:
            unit.pending.wait()
            unit.pending = None
            self._span(
                f"all-gather {unit.prefix or 'root'}",
                unit.t_launch,
                "comm",
                bytes=unit.flat.numel() * unit.flat.element_size(),
            )

    def _gather_params(self, unit: _Unit) -> None:
        """Stage 1/2 after the optimizer step: every rank's updated shard into ``unit.flat``."""
        mine = unit.shard.detach().clone()  # (s,) an input may not alias the output
        all_gather_single(unit.flat, mine, group=self.group)

    # ---- stage 2: reduce-scatter a unit's gradients as soon as backward has made them ------
    @torch.no_grad()
    def _grad_ready(self, unit: _Unit) -> None:
        unit.arrived += 1
        if unit.arrived < len(unit.names):
            return
        unit.arrived = 0
        params = [getattr(unit.module, n) for n in unit.names]
        flat_grad = torch.zeros_like(unit.flat)  # (N*s,) temporary, padded with zeros
        for view, p in zip(unit.views(flat_grad), params):
            view.copy_(p.grad)
            p.grad = None  # the full gradient is freed: stage 2 keeps only the shard
        g = self._reduce_scatter_mean(flat_grad, unit.prefix or "root")
        unit.shard.grad = g if unit.shard.grad is None else unit.shard.grad.add_(g)

    # ---- stage 3: gather before forward and backward, free after ----------------------------
    def _pre_forward(self, i: int) -> None:
        unit = self.units[i]
        self._all_gather(unit)  # waits for a prefetched gather, or gathers now
        if self.prefetch and i + 1 < len(self.units):
            self._all_gather(self.units[i + 1], wait=False)  # next unit's, in the background
        flat = _GatherParams.apply(unit.shard, unit.flat, self, unit)  # (N*s,) grad -> RS
        self._by_storage[unit.flat.untyped_storage().data_ptr()] = unit
        for name, view in zip(unit.names, unit.views(flat)):
            setattr(unit.module, name, view)
        unit.t_launch = self._now()

    def _post_forward(self, i: int, out) -> None:
        unit = self.units[i]
        self._span(f"forward {unit.prefix or 'root'}", unit.t_launch, "compute")
        for name in unit.names:
            setattr(unit.module, name, None)
        if self.reshard_after_forward:
            self._free(unit)
        # the unit's backward starts when the gradient of its output arrives: gather there
        outs = (
            [out]
            if isinstance(out, torch.Tensor)
            else [
                t
                for t in (out if isinstance(out, (tuple, list)) else ())
                if isinstance(t, torch.Tensor)
            ]
        )
        unit.backward_started = False
        for t in outs:
            if t.requires_grad:
                t.register_hook(lambda grad, i=i: self._pre_backward(i))

    def _pre_backward(self, i: int) -> None:
        unit = self.units[i]
        if unit.backward_started:  # a second output of the same unit
            return
        unit.backward_started = True
        self._all_gather(unit)  # no-op when the parameters were kept from forward
        self._by_storage[unit.flat.untyped_storage().data_ptr()] = unit
        if self.prefetch and self.reshard_after_forward and i > 0:
            self._all_gather(self.units[i - 1], wait=False)  # backward goes in reverse
        unit.t_launch = self._now()

    def _free(self, unit: _Unit) -> None:
        if unit.flat is not None:
            self._by_storage.pop(unit.flat.untyped_storage().data_ptr(), None)
        unit.flat = None

    def _pack(self, t: torch.Tensor):
        """Saved for backward: a gathered weight is saved as a ticket, not as its storage."""
        unit = self._by_storage.get(t.untyped_storage().data_ptr()) if t.numel() else None
        if unit is None:
            return t
        return (unit, t.shape, t.stride(), t.storage_offset())

    def _unpack(self, saved):
        if isinstance(saved, torch.Tensor):
            return saved
        unit, shape, stride, offset = saved
        self._all_gather(unit)  # already there after _pre_backward; gathered here otherwise
        return unit.flat.as_strided(shape, stride, offset)

    # ---- the module and the optimizer ---------------------------------------------------------
    def forward(self, *args, **kwargs):
        if self.stage != 3:
            return self.module(*args, **kwargs)
        with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
            return self.module(*args, **kwargs)

    @torch.no_grad()
    def step(self) -> None:
        """Average the gradients (stages 0, 1), update this rank's shard, share the result."""
        if self.stage == 0:  # DDP: all-reduce the full gradients, everyone updates everything
            for p in self.module.parameters():
                if p.grad is not None:
                    start = self._now()
                    dist.all_reduce(p.grad.div_(self.world_size), group=self.group)
                    self._span("all-reduce", start, "comm")
            self.optimizer.step()
            return
        if self.stage == 1:  # reduce-scatter the full local gradients into the shards
            for u in self.units:
                flat_grad = torch.zeros_like(u.flat)  # (N*s,) padded
                for view, name in zip(u.views(flat_grad), u.names):
                    g = getattr(u.module, name).grad
                    if g is not None:
                        view.copy_(g)
                u.shard.grad = self._reduce_scatter_mean(flat_grad, u.prefix or "root")
        self.optimizer.step()  # each rank updates its slice only
        if self.stage == 1:
            for u in self.units:
                u.shard.grad = None  # used once; the full local gradients stay until zero_grad
        if self.stage in (1, 2):
            for u in self.units:
                self._gather_params(u)  # stage 3 gathers in the next forward instead

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.module.zero_grad(set_to_none=set_to_none)
        self.optimizer.zero_grad(set_to_none=set_to_none)

    # ---- full tensors (parity checks) ---------------------------------------------------------
    @torch.no_grad()
    def full_tensors(self, which: str = "param") -> dict[str, torch.Tensor]:
        """``{name in the plain model: full tensor}`` of the parameters or of the gradients the
        next ``step()`` applies (the mean over ranks), as CPU copies. A collective: call it on
        every rank."""
        which = validate.choice("which", which, ("param", "grad"))
        if self.stage == 0 or (self.stage == 1 and which == "grad"):  # full local tensors
            out = {}
            for name, p in self.module.named_parameters():
                t = p if which == "param" else p.grad
                if t is None:
                    continue
                t = t.detach().clone()
                if which == "grad":
                    dist.all_reduce(t.div_(self.world_size), group=self.group)
                out[name] = t.cpu()
            return out
        out = {}
        for u in self.units:
            shard = u.shard if which == "param" else u.shard.grad
            if shard is None:
                continue
            flat = torch.empty(
                self.world_size * shard.numel(), dtype=shard.dtype, device=shard.device
            )
            all_gather_single(flat, shard.detach().clone(), group=self.group)
            for name, view in zip(u.names, u.views(flat)):
                out[f"{u.prefix}.{name}" if u.prefix else name] = view.clone().cpu()
        return out

    # ---- timeline -----------------------------------------------------------------------------
    def _now(self) -> int:
        return self.log.now_ns() if self.log is not None else 0

    def _span(self, name: str, start: int, lane: str, **meta) -> None:
        if self.log is not None:
            self.log.add(name, start, self.log.now_ns(), lane=lane, **meta)


class _GatherParams(torch.autograd.Function):
    """Stage 3's link between a shard and the full parameters: all-gather in forward (done by
    the caller, who passes the gathered ``flat``), reduce-scatter of the gradient in backward.
    Its gradient lands in ``shard.grad``: each rank keeps only its slice of the mean."""

    @staticmethod
    def forward(ctx, shard, flat, wrapper, unit):  # shard (s,), flat (N*s,)
        ctx.wrapper, ctx.unit = wrapper, unit
        return flat.view_as(flat)  # a new autograd node over the same storage

    @staticmethod
    def backward(ctx, grad_flat):  # (N*s,) this rank's gradient of the full parameters
        wrapper, unit = ctx.wrapper, ctx.unit
        wrapper._span(f"backward {unit.prefix or 'root'}", unit.t_launch, "compute")
        wrapper._free(unit)  # the unit's backward is done: drop the full parameters
        shard_grad = wrapper._reduce_scatter_mean(grad_flat.contiguous(), unit.prefix or "root")
        return shard_grad, None, None, None


def full_tensors(model: ZeroDataParallel, which: str = "param") -> dict[str, torch.Tensor]:
    """``harness.parallel_run``'s ``gather_fn`` for a :class:`ZeroDataParallel`."""
    if not isinstance(model, ZeroDataParallel):
        raise TypeError(f"model = {validate.describe(model)}: expected a ZeroDataParallel")
    return model.full_tensors(which)
