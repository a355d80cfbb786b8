"""Unit 10's check machinery: the flat ZeRO-1 layout of task 1, the drawn models and batches
of tasks 1 and 3, what the check sees after a learner's ZeRO-1 step, the measured run of task 2.

Used by :mod:`checks` only (workers run in the ranks it launches).
"""

from __future__ import annotations

from functools import partial

LR = 1e-2
_CATS = ("params", "grads", "optimizer")


class FlatModel:
    """The check's layout: one flat, padded (N*s,) tensor holding every parameter of ``model``
    (the parameters become views of it) and this rank's shard, a view of its slice."""

    def __init__(self, model, world_size: int, rank: int):
        import torch
        from torch import nn

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
        import torch

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


def _seen_in_step(layout, rank: int, world_size: int, want) -> str:
    """What the check sees after the learner's step: ``shard.grad`` against the mean over ranks
    of this rank's slice (``want``), and every rank's copy of the parameters against this one's."""
    import torch
    import torch.distributed as dist

    grad = layout.shard.grad
    note = ""
    if grad is None or grad.shape != want.shape:
        note = f"shard.grad is {'None' if grad is None else tuple(grad.shape)} after your step"
    elif not torch.allclose(grad, want, rtol=1e-9, atol=1e-12):
        ratio = float(grad.flatten() @ want.flatten() / (want.flatten() @ want.flatten()))
        note = (
            f"shard.grad is {ratio:.3g} x the mean over ranks of this rank's slice"
            if torch.allclose(grad, ratio * want, rtol=1e-6, atol=1e-12)
            else "shard.grad is not the mean over ranks of this rank's slice of the gradients"
        )
    copies = [torch.empty_like(layout.flat) for _ in range(world_size)]
    dist.all_gather(copies, layout.flat.detach().clone())
    other = next((q for q, c in enumerate(copies) if not torch.equal(c, copies[rank])), None)
    if not note and other is not None:
        note = (
            f"after your step rank {rank}'s flat_param differs from rank {other}'s in "
            f"{int((copies[other] != copies[rank]).sum())} elements: the ranks' copies disagree"
        )
    return note


class ZeroStep:
    """What the harness calls the optimizer in task 1: runs the learner's step, watching for the
    course's answers, and notes what it sees after it (the first note per rank)."""

    def __init__(self, layout, rank: int, world_size: int, fn, forbid):
        self.layout, self.rank, self.world_size = layout, rank, world_size
        self.fn, self.forbid = fn, forbid
        self.used: list[str] = []
        self.seen: list[tuple[int, str]] = []  # (step, what the check saw)
        self.steps = 0

    def step(self) -> None:
        import torch.distributed as dist

        from course_lib.grading.references import watch_references

        layout, rank = self.layout, self.rank
        g = layout.flat_grad()
        mean = g.clone()
        dist.all_reduce(mean)
        s = layout.shard.numel()
        want = (mean / self.world_size)[rank * s : (rank + 1) * s]
        with watch_references(self.forbid) as refs:
            self.fn(layout.flat, g, layout.shard, layout.optimizer)
        self.used.extend(u for u in refs if u not in self.used)
        self.steps += 1
        note = _seen_in_step(layout, rank, self.world_size, want)
        if note and not self.seen:
            self.seen.append((self.steps, note))

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.layout.model.zero_grad(set_to_none=True)
        self.layout.shard.grad = None


def _memory_model_of(width: int):
    import torch

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
