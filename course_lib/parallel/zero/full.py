"""ZeRO stage 3, full sharding (Rajbhandari et al. 2019, Sec. 5.3; PyTorch's FSDP).

Each rank keeps only its shard of every unit. A unit's parameters are all-gathered just before
its forward and freed after it, gathered *again* when the gradient of its output arrives, and
freed once its gradients are reduce-scattered (:class:`_GatherParams`'s backward): 3(N-1)/N x
Psi elements per rank and step, 1.5x DDP.

``reshard_after_forward=False`` keeps the gathered parameters from forward to backward (one
all-gather fewer, torch's ``fully_shard(reshard_after_forward=False)``); ``prefetch=True``
issues the next unit's all-gather asynchronously while the current one computes (units are
assumed to run in registration order). Autograd would keep every gathered weight alive until
backward; a saved-tensors hook stores a *ticket* instead (:meth:`_pack`) and gathers the weight
again when backward needs it (:meth:`_unpack`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from course_lib.parallel.tensor.comms import apply
from course_lib.parallel.zero.common import RUNS_STAGE, Unit, ZeroDataParallel
from course_lib.runtime.compat import all_gather_single

__all__ = ["FullySharded"]

_Ticket = tuple[Unit, torch.Size, tuple[int, ...], int]  # unit, shape, stride, storage offset


class FullySharded(ZeroDataParallel):
    """Stage 3 of :class:`~course_lib.parallel.zero.ZeroDataParallel`."""

    def _place(self, unit: Unit, flat: torch.Tensor) -> None:
        unit.shard = nn.Parameter(unit.shard.detach().clone())  # the shard only, not a view
        for name in unit.names:  # the module's weights become plain attributes
            delattr(unit.module, name)
            setattr(unit.module, name, None)

    def _install_hooks(self) -> None:
        self._by_storage: dict[int, Unit] = {}  # storage address of a gathered flat -> unit
        for i, u in enumerate(self.units):
            u.module.register_forward_pre_hook(lambda m, args, i=i: self._pre_forward(i))
            u.module.register_forward_hook(lambda m, args, out, i=i: self._post_forward(i, out))

    def _all_gather(self, unit: Unit, *, wait: bool = True) -> torch.Tensor:
        """Start (or finish) filling ``unit.flat`` (N*s,) with every rank's shard."""
        if unit.flat is None:
            unit.flat = unit.shard.new_empty(self.world_size * unit.shard.numel())
            unit.t_launch = self._now()
            unit.pending = all_gather_single(
                unit.flat, unit.shard.detach(), group=self.group, async_op=True
            )
        if wait and unit.pending is not None:
            unit.pending.wait()
            unit.pending = None
            size = unit.flat.numel() * unit.flat.element_size()
            self._span(f"all-gather {unit.label}", unit.t_launch, "comm", bytes=size)
        return unit.flat

    # ---- gather before forward and backward, free after -------------------------------------
    def _pre_forward(self, i: int) -> None:
        unit = self.units[i]
        gathered = self._all_gather(unit)  # waits for a prefetched gather, or gathers now
        if self.prefetch and i + 1 < len(self.units):
            self._all_gather(self.units[i + 1], wait=False)  # next unit's, in the background
        flat = apply(_GatherParams, unit.shard, gathered, self, unit)
        self._by_storage[gathered.untyped_storage().data_ptr()] = unit
        for name, view in zip(unit.names, unit.views(flat)):
            setattr(unit.module, name, view)
        unit.t_launch = self._now()

    def _post_forward(self, i: int, out: Any) -> None:
        unit = self.units[i]
        self._span(f"forward {unit.label}", unit.t_launch, "compute")
        for name in unit.names:
            setattr(unit.module, name, None)
        if self.reshard_after_forward:
            self._free(unit)
        # the unit's backward starts when the gradient of its output arrives: gather there
        outs = (
            [out]
            if isinstance(out, torch.Tensor)
            else out
            if isinstance(out, (tuple, list))
            else []
        )
        unit.backward_started = False
        for t in outs:
            if isinstance(t, torch.Tensor) and t.requires_grad:
                hook = lambda grad, i=i: self._pre_backward(i)  # noqa: E731
                t.register_hook(hook)

    def _pre_backward(self, i: int) -> None:
        unit = self.units[i]
        if unit.backward_started:  # a second output of the same unit
            return
        unit.backward_started = True
        gathered = self._all_gather(unit)  # no-op when the parameters were kept from forward
        self._by_storage[gathered.untyped_storage().data_ptr()] = unit
        if self.prefetch and self.reshard_after_forward and i > 0:
            self._all_gather(self.units[i - 1], wait=False)  # backward goes in reverse
        unit.t_launch = self._now()

    def _free(self, unit: Unit) -> None:
        if unit.flat is not None:
            self._by_storage.pop(unit.flat.untyped_storage().data_ptr(), None)
        unit.flat = None

    def _pack(self, t: torch.Tensor) -> torch.Tensor | _Ticket:
        """Saved for backward: a gathered weight is saved as a ticket, not as its storage."""
        unit = self._by_storage.get(t.untyped_storage().data_ptr()) if t.numel() else None
        if unit is None:
            return t
        return (unit, t.shape, t.stride(), int(t.storage_offset()))

    def _unpack(self, saved: torch.Tensor | _Ticket) -> torch.Tensor:
        if isinstance(saved, torch.Tensor):
            return saved
        unit, shape, stride, offset = saved
        flat = self._all_gather(unit)  # already there after _pre_backward; gathered otherwise
        return flat.as_strided(shape, stride, offset)

    # ---- the module and the optimizer ---------------------------------------------------------
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
            return self.module(*args, **kwargs)

    @torch.no_grad()
    def step(self) -> None:
        """Update this rank's shards (their gradients arrived by reduce-scatter in backward);
        the next forward gathers the new parameters."""
        self.optimizer.step()


class _GatherParams(torch.autograd.Function):
    """The link between a shard and the full parameters: all-gather in forward (done by the
    caller, who passes the gathered ``flat``), reduce-scatter of the gradient in backward.
    Its gradient lands in ``shard.grad``: each rank keeps only its slice of the mean."""

    @staticmethod
    def forward(
        ctx: Any, shard: torch.Tensor, flat: torch.Tensor, wrapper: FullySharded, unit: Unit
    ) -> torch.Tensor:  # shard (s,), flat (N*s,)
        ctx.wrapper, ctx.unit = wrapper, unit
        return flat.view_as(flat)  # a new autograd node over the same storage

    @staticmethod
    def backward(ctx: Any, grad_flat: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        wrapper, unit = ctx.wrapper, ctx.unit
        wrapper._span(f"backward {unit.label}", unit.t_launch, "compute")
        wrapper._free(unit)  # the unit's backward is done: drop the full parameters
        shard_grad = wrapper._reduce_scatter_mean(grad_flat.contiguous(), unit.label)
        return shard_grad, None, None, None


RUNS_STAGE[3] = FullySharded  # ZeroDataParallel(..., stage=3) makes one
