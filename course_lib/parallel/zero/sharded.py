"""ZeRO stages 0-2: the sharded optimizer (Rajbhandari et al. 2019, Sec. 5.1-5.2).

Every rank keeps the full parameters (the module's parameters are views of each unit's flat
tensor, and so is this rank's shard, which the optimizer updates). After the update an
all-gather gives every rank every updated shard.

* stage 0: plain data parallelism, one all-reduce per parameter tensor in ``step()``;
* stage 1: ``step()`` reduce-scatters the full local gradients into the shards;
* stage 2: each unit's gradients are reduce-scattered as soon as backward has produced them
  (a post-accumulate-grad hook), and the full gradients are freed.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.distributed as dist
from torch import nn

from course_lib import validate
from course_lib.parallel.zero.common import RUNS_STAGE, Unit, ZeroDataParallel
from course_lib.runtime.compat import all_gather_single

__all__ = ["ShardedOptimizer"]


class ShardedOptimizer(ZeroDataParallel):
    """Stages 0, 1 and 2 of :class:`~course_lib.parallel.zero.ZeroDataParallel`."""

    def _place(self, unit: Unit, flat: torch.Tensor) -> None:
        unit.flat = flat  # the full parameters stay; module parameters are views of flat
        for name, view in zip(unit.names, unit.views(flat)):
            setattr(unit.module, name, nn.Parameter(view))

    def _install_hooks(self) -> None:
        if self.stage != 2:
            return
        for u in self.units:
            for p in [getattr(u.module, n) for n in u.names]:
                p.register_post_accumulate_grad_hook(lambda p, u=u: self._grad_ready(u))

    # ---- stage 2: reduce-scatter a unit's gradients as soon as backward has made them ------
    @torch.no_grad()
    def _grad_ready(self, unit: Unit) -> None:
        unit.arrived += 1
        if unit.arrived < len(unit.names):
            return
        unit.arrived = 0
        params = [getattr(unit.module, n) for n in unit.names]
        flat_grad = torch.zeros_like(self._flat(unit))  # (N*s,) temporary, padded with zeros
        for view, p in zip(unit.views(flat_grad), params):
            view.copy_(p.grad)
            p.grad = None  # the full gradient is freed: stage 2 keeps only the shard
        g = self._reduce_scatter_mean(flat_grad, unit.label)
        unit.shard.grad = g if unit.shard.grad is None else unit.shard.grad.add_(g)

    # ---- the step -----------------------------------------------------------------------------
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
                flat_grad = torch.zeros_like(self._flat(u))  # (N*s,) padded
                for view, name in zip(u.views(flat_grad), u.names):
                    g = getattr(u.module, name).grad
                    if g is not None:
                        view.copy_(g)
                u.shard.grad = self._reduce_scatter_mean(flat_grad, u.label)
        self.optimizer.step()  # each rank updates its slice only
        for u in self.units:
            if self.stage == 1:
                u.shard.grad = None  # used once; the full local gradients stay until zero_grad
            mine = u.shard.detach().clone()  # (s,) an input may not alias the output
            all_gather_single(self._flat(u), mine, group=self.group)  # everyone's new shards

    @staticmethod
    def _flat(u: Unit) -> torch.Tensor:
        assert u.flat is not None  # stages 1 and 2 keep the full parameters
        return u.flat

    # ---- full tensors (parity checks) ---------------------------------------------------------
    @torch.no_grad()
    def full_tensors(self, which: Literal["param", "grad"] = "param") -> dict[str, torch.Tensor]:
        which = validate.choice("which", which, ("param", "grad"))
        if not (self.stage == 0 or (self.stage == 1 and which == "grad")):
            return super().full_tensors(which)
        out = {}  # the full local tensors (gradients: their mean over ranks)
        for name, p in self.module.named_parameters():
            t = p if which == "param" else p.grad
            if t is None:
                continue
            t = t.detach().clone()
            if which == "grad":
                dist.all_reduce(t.div_(self.world_size), group=self.group)
            out[name] = t.cpu()
        return out


RUNS_STAGE.update(dict.fromkeys((0, 1, 2), ShardedOptimizer))  # ZeroDataParallel(stage=0-2)
