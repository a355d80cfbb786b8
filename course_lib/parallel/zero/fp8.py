"""ZeRO-3 whose all-gathers carry bf16 or FP8 copies of the fp32 shards.

The master shards stay fp32 (the optimizer updates them); only what travels is narrower:

* ``gather="bf16"``: every unit's shard is cast to bf16 before its all-gather and back after,
  like FSDP2's ``MixedPrecisionPolicy(param_dtype=torch.bfloat16)``: 2 B per parameter.
* ``gather="fp8"``: the units of linear layers (``nn.Linear`` or ``Float8Linear``, except the
  names in ``skip``) are cast to E4M3 with one scale per unit, 1 B per parameter; the others go
  in bf16. The scale must be the same on every rank, so each unit first all-reduces (MAX) the
  amax of its shards: 4 B more per unit. This is torchao's float8 all-gather for FSDP2
  (``enable_fsdp_float8_all_gather``: tensorwise only, the amax all-reduced), written from
  scratch on the course's ZeRO-3; the gathered weights are dequantised to fp32 here, where a GPU
  would feed the FP8 bytes straight to its FP8 GEMM with the same scale.

The scale of a unit is computed once per step (forward) and reused when backward gathers the
same shards again; :meth:`step` forgets it. Gathers are synchronous (no ``prefetch``).
Introduced in notebooks/17_fp8_training.ipynb.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from course_lib import validate
from course_lib.parallel.zero.common import Unit
from course_lib.parallel.zero.full import FullySharded
from course_lib.runtime.compat import all_gather_single
from course_lib.techniques.fp8 import fp8_max, to_float8

__all__ = ["GATHERS", "LowPrecisionGatherSharded", "gathered_numels"]

#: what the all-gathers carry
GATHERS = ("fp32", "bf16", "fp8")


class LowPrecisionGatherSharded(FullySharded):
    """ZeRO stage 3 (:class:`~course_lib.parallel.zero.full.FullySharded`) gathering ``gather``
    copies of its fp32 shards (module doc). ``skip``: unit names whose linear layer keeps bf16
    (the output head by default). Other keywords as ``ZeroDataParallel`` (stage is 3)."""

    def __init__(
        self,
        module: nn.Module,
        *,
        gather: str = "fp8",
        skip: Iterable[str] = ("lm_head",),
        **kwargs: Any,
    ) -> None:
        self.gather = validate.choice("gather", gather, GATHERS)
        self.skip = [skip] if isinstance(skip, str) else list(skip)
        if kwargs.get("prefetch"):
            raise ValueError("prefetch = True: expected False (these gathers are synchronous)")
        self._scales: dict[int, torch.Tensor] = {}
        self.largest_gather_bytes = 0  # the largest buffer an all-gather filled, in bytes
        super().__init__(module, stage=3, **kwargs)

    def fp8_unit(self, unit: Unit) -> bool:
        """Whether ``unit`` travels in FP8: a linear layer's unit, not skipped, gather="fp8"."""
        from course_lib.techniques.fp8_linear import Float8Linear

        name = unit.prefix.rsplit(".", 1)[-1]
        linear = isinstance(unit.module, (nn.Linear, Float8Linear))
        return self.gather == "fp8" and linear and name not in self.skip

    def _scale(self, unit: Unit) -> torch.Tensor:
        """The unit's dequantisation scale: max over ranks of the shards' amax / 448."""
        key = id(unit)
        if key not in self._scales:
            amax = unit.shard.detach().abs().max().float().reshape(1)  # (1,)
            dist.all_reduce(amax, op=dist.ReduceOp.MAX, group=self.group)
            self._scales[key] = amax.clamp_min(1e-12) / fp8_max("e4m3")
        return self._scales[key]

    def _all_gather(self, unit: Unit, *, wait: bool = True) -> torch.Tensor:
        """Fill ``unit.flat`` (N*s,) fp32 from every rank's shard, sent as ``gather``."""
        if self.gather == "fp32":
            flat = super()._all_gather(unit, wait=wait)
            self.largest_gather_bytes = max(self.largest_gather_bytes, flat.numel() * 4)
            return flat
        if unit.flat is None:
            shard = unit.shard.detach()  # (s,) fp32 master
            n = self.world_size * shard.numel()
            if self.fp8_unit(unit):
                scale = self._scale(unit)
                q = to_float8(shard, dtype="e4m3", scale=scale)  # one scale on every rank
                out = torch.empty(n, dtype=torch.uint8, device=shard.device)
                all_gather_single(out, q.data.view(torch.uint8), group=self.group)
                unit.flat = out.view(torch.float8_e4m3fn).float() * scale  # (N*s,)
            else:
                out = torch.empty(n, dtype=torch.bfloat16, device=shard.device)
                all_gather_single(out, shard.to(torch.bfloat16), group=self.group)
                unit.flat = out.float()  # (N*s,)
            self.largest_gather_bytes = max(
                self.largest_gather_bytes, out.numel() * out.element_size()
            )
        return unit.flat

    @torch.no_grad()
    def step(self) -> None:
        """Update the fp32 shards; the next forward computes new scales."""
        self.optimizer.step()
        self._scales.clear()


def gathered_numels(model: LowPrecisionGatherSharded) -> dict[str, int]:
    """Values one all-gather of every unit fills (N*s each, padding included), split into the
    units that travel in FP8 under ``gather="fp8"`` (``linear``: linear layers not skipped) and
    the ``other`` units, and the ``largest`` unit's count."""
    out = {"linear": 0, "other": 0, "largest": 0}
    for u in model.units:
        n = model.world_size * u.shard.numel()
        name = u.prefix.rsplit(".", 1)[-1]
        linear = isinstance(u.module, nn.Linear) or type(u.module).__name__ == "Float8Linear"
        out["linear" if linear and name not in model.skip else "other"] += n
        out["largest"] = max(out["largest"], n)
    return out
