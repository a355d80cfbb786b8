"""What every ZeRO stage shares: :class:`ZeroDataParallel`'s constructor and checks, the flat
padded layout of a module's parameters, the reduce-scatter of gradients and the timeline.
Stages 0-2: ``sharded.py``; stage 3: ``full.py``; the whole story: the package front,
``__init__.py``.

Layout. Every module that directly owns parameters (a Linear, a LayerNorm...) is a *unit*. A
unit's parameters are laid end to end in one flat tensor of Psi_u elements, padded with zeros to
N x s elements, s = ceil(Psi_u / N), so that it cuts into N equal shards; rank r owns elements
[r s, (r+1) s). Padding costs at most N-1 elements per unit (``estimate.zero_padding``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch import nn

from course_lib import validate
from course_lib.measure.timing import EventLog
from course_lib.parallel.collectives import ring_reduce_scatter
from course_lib.parallel.ddp import broadcast_parameters
from course_lib.runtime.compat import all_gather_single, reduce_scatter_single
from course_lib.runtime.groups import Group, group_info

__all__ = ["STAGES", "shard_numel", "Unit", "ZeroDataParallel", "check_options", "full_tensors"]

STAGES = (0, 1, 2, 3)


def shard_numel(numel: int, world_size: int) -> int:
    """Elements of one rank's shard of a unit of ``numel`` elements: ceil(numel / N)."""
    return -(-numel // world_size)


@dataclass
class Unit:
    """One module's parameters as one flat, padded tensor cut into N shards."""

    module: nn.Module
    prefix: str  # the module's name in the wrapped model ("" for the root)
    names: list[str]  # its own parameters' names (no prefix)
    shapes: list[torch.Size]
    numel: int  # Psi_u, without padding
    shard: nn.Parameter  # (s,) this rank's slice; what the optimizer updates
    offsets: list[int] = field(default_factory=list)
    flat: torch.Tensor | None = None  # (N*s,) the full parameters, when present
    pending: dist.Work | None = None  # an async all-gather (prefetch)
    arrived: int = 0  # stage 2: gradients produced by this backward
    backward_started: bool = False  # stage 3: the unit's gather for backward is issued
    t_launch: int = 0  # timeline: when the pending all-gather was launched

    @property
    def label(self) -> str:
        return self.prefix or "root"

    def views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """The unit's parameters as views of ``flat`` (N*s,), in their shapes."""
        return [flat[o : o + s.numel()].view(s) for o, s in zip(self.offsets, self.shapes)]


def _check_module_type(module: Any) -> None:
    if not isinstance(module, nn.Module):
        raise TypeError(f"module = {validate.describe(module)}: expected a torch.nn.Module")


def _check_params(module: nn.Module) -> None:
    params = list(module.parameters())
    if not params or not all(p.requires_grad for p in params):
        raise ValueError(
            "module: expected parameters that all require a gradient (freeze "
            "nothing under ZeroDataParallel)"
        )
    kinds = {(p.dtype, p.device) for p in params}
    if len(kinds) > 1:
        raise ValueError(
            f"module = parameters of dtypes/devices {sorted(map(str, kinds))}: expected "
            "one dtype and device (a unit is one flat tensor); cast the module first"
        )


def check_options(stage: Any, optimizer: Any, reshard_after_forward: Any, prefetch: Any) -> int:
    """Refuse a bad stage, optimizer class or stage-3 option; returns the stage."""
    if isinstance(stage, bool):
        raise TypeError(f"stage = {stage!r}: expected one of 0, 1, 2, 3 (an int)")
    stage = validate.choice("stage", stage, STAGES)
    if not (isinstance(optimizer, type) and issubclass(optimizer, torch.optim.Optimizer)):
        raise TypeError(
            f"optimizer = {validate.describe(optimizer)}: expected a "
            "torch.optim.Optimizer class, e.g. torch.optim.AdamW"
        )
    validate.choice("reshard_after_forward", reshard_after_forward, (True, False))
    validate.choice("prefetch", prefetch, (True, False))
    if stage != 3 and (prefetch or not reshard_after_forward):
        raise ValueError(
            f"stage = {stage}: prefetch and reshard_after_forward concern stage 3 "
            "(parameters gathered per layer); expected stage = 3 or the defaults"
        )
    return int(stage)


#: the class that runs each stage: sharded.py and full.py enter theirs where they
#: define it (zero.py imports both), so this file never imports them
RUNS_STAGE: dict[int, type[ZeroDataParallel]] = {}


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

    The object made is a :class:`ShardedOptimizer` (stages 0-2) or a :class:`FullySharded`
    (stage 3), both ZeroDataParallel.
    """

    def __new__(cls, *args: Any, stage: Any = None, **kwargs: Any) -> ZeroDataParallel:
        if cls is ZeroDataParallel:  # the stage picks the class that runs it
            runs = RUNS_STAGE.get(3 if stage == 3 else 0)
            if runs is None:
                raise RuntimeError(
                    "the ZeRO stages are defined in zero/sharded.py and zero/full.py: import "
                    "ZeroDataParallel from course_lib.parallel.zero"
                )
            cls = runs
        return super().__new__(cls)

    def __init__(
        self,
        module: nn.Module,
        *,
        stage: int,
        optimizer: type[torch.optim.Optimizer] = torch.optim.AdamW,
        group: Group = None,
        reshard_after_forward: bool = True,
        prefetch: bool = False,
        log: EventLog | None = None,
        **optimizer_kwargs: Any,
    ) -> None:
        super().__init__()
        _check_module_type(module)
        self.stage = check_options(stage, optimizer, reshard_after_forward, prefetch)
        self.reshard_after_forward, self.prefetch = reshard_after_forward, prefetch
        self._setup(module, group, log)
        shards = [u.shard for u in self.units]
        self.optimizer = optimizer(shards if shards else module.parameters(), **optimizer_kwargs)
        self._install_hooks()

    def _install_hooks(self) -> None:
        """The stage's hooks on the wrapped module (stage 2: gradients; stage 3: gathers)."""

    def step(self) -> None:
        """Average the gradients, update this rank's shard, share the result."""
        raise NotImplementedError

    def _setup(self, module: nn.Module, group: Group, log: EventLog | None) -> None:
        """Check ``module``, broadcast it from rank 0 and cut it into units (stages 1-3)."""
        _check_params(module)
        self.module, self.group, self.log = module, group, log
        info = group_info(group, needs="data parallelism")
        self.world_size, self.rank = info.world_size, info.rank
        broadcast_parameters(module, group)  # every rank starts from rank 0's model
        self.units = []
        self._shards = nn.ParameterList()  # registered, so MemoryMeter counts them as parameters
        if self.stage == 0:
            return
        for prefix, sub in module.named_modules():
            if any(True for _ in sub.parameters(recurse=False)):
                self.units.append(self._make_unit(prefix, sub))

    @torch.no_grad()
    def _make_unit(self, prefix: str, sub: nn.Module) -> Unit:
        own = list(sub.named_parameters(recurse=False))
        numel = sum(p.numel() for _, p in own)
        s = shard_numel(numel, self.world_size)
        p0 = own[0][1]
        flat = torch.zeros(self.world_size * s, dtype=p0.dtype, device=p0.device)  # (N*s,) padded
        offsets = [0]
        for _, p in own:
            offsets.append(offsets[-1] + p.numel())
        for o, (_, p) in zip(offsets, own):
            flat[o : o + p.numel()].copy_(p.reshape(-1))
        mine = flat[self.rank * s : (self.rank + 1) * s]  # (s,) this rank's slice
        names, shapes = [n for n, _ in own], [p.shape for _, p in own]
        unit = Unit(sub, prefix, names, shapes, numel, nn.Parameter(mine), offsets[:-1])
        self._place(unit, flat)
        self._shards.append(unit.shard)
        return unit

    def _place(self, unit: Unit, flat: torch.Tensor) -> None:
        """Where the stage keeps the unit's full parameters (``flat``, filled)."""
        raise NotImplementedError

    def _reduce_scatter_mean(self, flat_grad: torch.Tensor, name: str) -> torch.Tensor:
        """(N*s,) local gradients -> (s,) this rank's slice of their mean over ranks. On gloo
        with the course's ring (gloo's own sends twice the ring's bytes: see ``zero.py``)."""
        n = flat_grad.numel() // self.world_size
        out = torch.empty(n, dtype=flat_grad.dtype, device=flat_grad.device)
        start = self._now()
        if flat_grad.device.type == "cpu":  # CPU tensors go through gloo (also under NCCL)
            ring_reduce_scatter(out, flat_grad, self.group)
        else:
            reduce_scatter_single(out, flat_grad, group=self.group)
        size = flat_grad.numel() * flat_grad.element_size()
        self._span(f"reduce-scatter {name}", start, "comm", bytes=size)
        return out.div_(self.world_size)

    def _gather_shards(self, shard: torch.Tensor) -> torch.Tensor:
        """(N*s,) every rank's ``shard`` (s,), in rank order (a fresh tensor)."""
        flat = shard.new_empty(self.world_size * shard.numel())
        all_gather_single(flat, shard.detach().clone(), group=self.group)
        return flat

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.module.zero_grad(set_to_none=set_to_none)
        self.optimizer.zero_grad(set_to_none=set_to_none)

    @torch.no_grad()
    def full_tensors(self, which: Literal["param", "grad"] = "param") -> dict[str, torch.Tensor]:
        """``{name in the plain model: full tensor}`` of the parameters or of the gradients the
        next ``step()`` applies (the mean over ranks), as CPU copies. A collective: call it on
        every rank."""
        which = validate.choice("which", which, ("param", "grad"))
        out = {}
        for u in self.units:
            shard = u.shard if which == "param" else u.shard.grad
            if shard is None:
                continue
            for name, view in zip(u.names, u.views(self._gather_shards(shard))):
                out[f"{u.prefix}.{name}" if u.prefix else name] = view.clone().cpu()
        return out

    # ---- timeline -----------------------------------------------------------------------------
    def _now(self) -> int:
        return self.log.now_ns() if self.log is not None else 0

    def _span(self, name: str, start: int, lane: str, **meta: Any) -> None:
        if self.log is not None:
            self.log.add(name, start, self.log.now_ns(), lane=lane, **meta)


def full_tensors(
    model: ZeroDataParallel, which: Literal["param", "grad"] = "param"
) -> dict[str, torch.Tensor]:
    """``harness.parallel_run``'s ``gather_fn`` for a :class:`ZeroDataParallel`."""
    if not isinstance(model, ZeroDataParallel):
        raise TypeError(f"model = {validate.describe(model)}: expected a ZeroDataParallel")
    return model.full_tensors(which)
