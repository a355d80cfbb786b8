"""Unit 10's check machinery, run in the ranks the checks launch: the flat ZeRO-1 layout of
task 1 and what is recorded around a learner's ZeRO-1 step, the drawn models and batches of
tasks 1 and 3, task 3's stage-2 layout around a learner's gradient hook, and the measured run of
task 2 (the judge's: it runs the course's ZeroDataParallel).

Used by :mod:`checks` and its sections only.
"""

from __future__ import annotations

from functools import partial

import torch
from torch import nn

LR = 1e-2
_CATS = ("params", "grads", "optimizer")


class FlatModel:
    """The check's layout: one flat, padded (N*s,) tensor holding every parameter of ``model``
    (the parameters become views of it) and this rank's shard, a view of its slice."""

    def __init__(self, model, world_size: int, rank: int):
        named = list(model.named_parameters())
        psi = sum(p.numel() for _, p in named)
        s = -(-psi // world_size)
        self.flat = torch.zeros(world_size * s, dtype=named[0][1].dtype)  # (N*s,)
        self.slices = []
        offset = 0
        for name, p in named:
            view = self.flat[offset : offset + p.numel()].view_as(p)
            view.copy_(p.detach())
            module_name, _, attr = name.rpartition(".")
            setattr(model.get_submodule(module_name), attr, nn.Parameter(view))
            self.slices.append((name, offset, p.numel()))
            offset += p.numel()
        self.model = model
        self.shard = nn.Parameter(self.flat[rank * s : (rank + 1) * s])  # (s,) a view
        self.optimizer = torch.optim.AdamW([self.shard], lr=LR)

    def flat_grad(self):
        g = torch.zeros_like(self.flat)  # (N*s,) this rank's local gradients, padded
        params = dict(self.model.named_parameters())
        for name, offset, numel in self.slices:
            if params[name].grad is not None:
                g[offset : offset + numel] = params[name].grad.reshape(-1)
        return g


def drawn_model(case: dict, seed: int = 0):
    """The drawn MLP of a case (``seed``: the harness's argument; the case's own seed wins)."""
    from course_lib.units.u10_zero_fsdp.run import model_fn

    return model_fn(case["seed"], width=case["width"])


def drawn_batch(case: dict, step: int):
    """The full batch of ``step`` in a case (24 rows; seeds drawn with the case)."""
    from course_lib.units.u10_zero_fsdp.run import batch_fn

    return batch_fn(case["batch"] + step)


def _case_fns(case: dict):
    return partial(drawn_model, case), partial(drawn_batch, case)


class ZeroStep:
    """What the harness calls the optimizer in task 1: runs the learner's step, watching for the
    course's answers, and records around it what the judge compares (it decides nothing): per
    step, the local gradients handed in, ``shard.grad`` and this rank's ``flat_param`` after it."""

    def __init__(self, layout, rank: int, world_size: int, fn, forbid):
        self.layout, self.rank, self.world_size = layout, rank, world_size
        self.fn, self.forbid = fn, forbid
        self.used: list[str] = []
        self.steps: list[dict] = []  # per step: {"grad", "shard_grad", "flat"} (CPU copies)

    def step(self) -> None:
        from course_lib.grading.references import watch_references

        layout = self.layout
        g = layout.flat_grad()  # (N*s,) this rank's local gradients, handed to the learner
        handed = g.clone()  # before the call: the learner may write into flat_grad
        with watch_references(self.forbid) as refs:
            self.fn(layout.flat, g, layout.shard, layout.optimizer)
        self.used.extend(u for u in refs if u not in self.used)
        grad = layout.shard.grad
        self.steps.append(
            {
                "grad": handed,
                "shard_grad": None if grad is None else grad.detach().clone(),
                "flat": layout.flat.detach().clone(),
            }
        )

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.layout.model.zero_grad(set_to_none=True)
        self.layout.shard.grad = None


class _Unit:
    """One module's parameters in task 3's stage-2 layout (see :class:`Stage2Host`)."""

    def __init__(self, module, prefix: str, names: list[str], flat, shard):
        self.module, self.prefix, self.names = module, prefix, names
        self.flat, self.shard = flat, shard  # (N*s,) the full parameters; (s,) a view of it
        self.arrived = 0  # gradients produced by this backward


class Stage2Host(nn.Module):
    """Task 3's ZeRO stage 2 around the learner's gradient hook (the course's ZeroDataParallel is
    an answer the learner may not call, so the check brings its own layout). Every module that
    owns parameters is a unit: its parameters become views of one flat (N*s,) tensor padded with
    zeros, this rank's shard a view of its slice, updated by AdamW. Once backward has produced
    all of a unit's gradients the learner's ``fn(params, shard)`` runs, watched for the course's
    answers; ``step()`` updates the shards and all-gathers them into every rank's flat tensor."""

    def __init__(self, model, rank: int, world_size: int, fn, forbid):
        super().__init__()
        self.module = model
        self.rank, self.world_size, self.fn, self.forbid = rank, world_size, fn, forbid
        self.used: list[str] = []
        self._shards = nn.ParameterList()  # registered: MemoryMeter counts the shards' grads
        self.units = [
            self._unit(prefix, sub)
            for prefix, sub in model.named_modules()
            if any(True for _ in sub.parameters(recurse=False))
        ]
        self.optimizer = torch.optim.AdamW(list(self._shards), lr=LR)

    @torch.no_grad()
    def _unit(self, prefix: str, sub) -> _Unit:
        own = list(sub.named_parameters(recurse=False))
        s = -(-sum(p.numel() for _, p in own) // self.world_size)
        flat = torch.zeros(self.world_size * s, dtype=own[0][1].dtype)  # (N*s,) padded
        offset = 0
        for name, p in own:
            view = flat[offset : offset + p.numel()].view_as(p)
            view.copy_(p)
            setattr(sub, name, nn.Parameter(view))
            offset += p.numel()
        shard = nn.Parameter(flat[self.rank * s : (self.rank + 1) * s])  # (s,) a view
        self._shards.append(shard)
        unit = _Unit(sub, prefix, [name for name, _ in own], flat, shard)
        for name in unit.names:
            getattr(sub, name).register_post_accumulate_grad_hook(lambda p, u=unit: self._ready(u))
        return unit

    def _ready(self, unit: _Unit) -> None:
        from course_lib.grading.references import watch_references

        unit.arrived += 1
        if unit.arrived < len(unit.names):
            return
        unit.arrived = 0
        with watch_references(self.forbid) as seen:
            self.fn([getattr(unit.module, n) for n in unit.names], unit.shard)
        self.used.extend(u for u in seen if u not in self.used)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @torch.no_grad()
    def step(self) -> None:
        from course_lib.runtime.compat import all_gather_single

        self.optimizer.step()  # this rank's shards only
        for u in self.units:
            all_gather_single(u.flat, u.shard.detach().clone())  # everyone's new shards

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.module.zero_grad(set_to_none=set_to_none)
        self.optimizer.zero_grad(set_to_none=set_to_none)

    @torch.no_grad()
    def gather(self, which: str) -> dict[str, torch.Tensor]:
        """The harness's ``gather_fn``: this rank's parameters, or the gradients the next step
        applies (every rank's ``shard.grad`` as the learner left it, put together), by name."""
        from course_lib.runtime.compat import all_gather_single

        out = {}
        for u in self.units:
            if which == "param":
                full = u.flat
            elif u.shard.grad is None:
                continue
            else:
                full = u.shard.grad.new_empty(self.world_size * u.shard.numel())
                all_gather_single(full, u.shard.grad.detach().clone())
            offset = 0
            for name in u.names:
                p = getattr(u.module, name)
                key = f"{u.prefix}.{name}" if u.prefix else name
                out[key] = full[offset : offset + p.numel()].view_as(p).clone()
                offset += p.numel()
        return out


def _memory_model_of(width: int):
    from course_lib.units.u10_zero_fsdp.run import model_fn

    return model_fn(0, width=width, out=3, dtype=torch.float32)


def _state_worker(rank: int, world_size: int, width: int) -> list[dict]:
    """One AdamW step (float32) of the drawn memory model at each stage; what MemoryMeter finds
    in this rank after it (before zero_grad)."""
    from course_lib.measure.memory import MemoryMeter
    from course_lib.parallel import harness as H
    from course_lib.parallel.zero import ZeroDataParallel
    from course_lib.units.u10_zero_fsdp._setup import _memory_batch

    rows = []
    for stage in (0, 1, 2, 3):
        model = ZeroDataParallel(_memory_model_of(width), stage=stage, lr=LR)
        H.mse_loss(model, H.shard_batch(_memory_batch(0), rank, world_size)).backward()
        model.step()
        with MemoryMeter(model, model.optimizer) as after:
            pass
        bd = after.start_breakdown
        rows.append({"rank": rank, "stage": stage, **{k: bd[k] for k in _CATS}})
    return rows
