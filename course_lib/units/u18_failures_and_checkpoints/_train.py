"""Unit 18's run: a small MLP trained ZeRO-3 style (every parameter and Adam moment a DTensor
shard) whose steps come out bit for bit the same on 1, 2 or 4 ranks.

What makes it exact across world sizes: the global batch is cut into ``CHUNKS`` fixed chunks;
each rank computes the gradients of its chunks on the gathered (full) weights, the chunk
gradients are all-gathered and summed in chunk order (the same additions in the same order
whatever the world size), and each rank's AdamW updates its own shard element by element. Dropout
masks are drawn for the whole global batch from the same generator on every rank.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

from course_lib.resilience import PARTS, TrainState

#: the global batch is cut into this many chunks (world sizes 1, 2, 4 divide it)
CHUNKS = 4
#: sequences (samples) per global batch
BATCH = 32
#: the MLP's widths: input, two hidden layers, classes
WIDTHS = (16, 64, 64, 8)
#: samples in the synthetic data set (an epoch is SAMPLES // BATCH steps)
SAMPLES = 256
#: dropout probability after each hidden layer (its masks use torch's default generator)
DROPOUT = 0.1


def make_data(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A teacher task: inputs and the class a fixed random linear map picks (own generator, so
    the global RNGs are untouched)."""
    gen = torch.Generator().manual_seed(1000 + seed)
    x = torch.randn(SAMPLES, WIDTHS[0], generator=gen)
    teacher = torch.randn(WIDTHS[0], WIDTHS[-1], generator=gen)
    return x, (x @ teacher).argmax(dim=1)


class Batches:
    """The data loader's position: a fresh shuffle each epoch (seeded by the epoch), and how far
    into it the run is. ``state_dict`` is all a resume needs."""

    def __init__(self, seed: int = 0) -> None:
        self.seed, self.epoch, self.position = seed, 0, 0

    def next_indices(self) -> torch.Tensor:
        if self.position + BATCH > SAMPLES:
            self.epoch, self.position = self.epoch + 1, 0
        perm = torch.randperm(
            SAMPLES, generator=torch.Generator().manual_seed(self.seed + self.epoch)
        )
        idx = perm[self.position : self.position + BATCH]
        self.position += BATCH
        return idx

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, sd: dict) -> None:
        self.epoch, self.position = int(sd["epoch"]), int(sd["position"])


class MLP(torch.nn.Module):
    """Three linear layers; the forward pass is :func:`forward` on the gathered weights."""

    def __init__(self, widths: tuple[int, ...] = WIDTHS) -> None:
        super().__init__()
        self.widths = w = widths
        self.fc1, self.fc2 = torch.nn.Linear(w[0], w[1]), torch.nn.Linear(w[1], w[2])
        self.fc3 = torch.nn.Linear(w[2], w[3])


def forward(full: list[torch.Tensor], x: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
    """Logits of the MLP from its six weights (fc1 w, b, fc2 w, b, fc3 w, b) with dropout
    masks (B, 2 x hidden) already drawn."""
    hidden = full[0].shape[0]
    h = torch.relu(x @ full[0].T + full[1]) * masks[:, :hidden] / (1 - DROPOUT)
    h = torch.relu(h @ full[2].T + full[3]) * masks[:, hidden:] / (1 - DROPOUT)
    return h @ full[4].T + full[5]  # (B, classes)


def schedule(steps: int, warmup: int = 4):
    """Warm-up then cosine decay, as a LambdaLR factor of the step."""

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, steps - warmup))))

    return factor


def build(
    *, seed: int = 0, steps: int = 40, lr: float = 1e-2, parts=PARTS, widths=WIDTHS
) -> TrainState:
    """The run's state on this process's ranks (a 1-D mesh over the world; also on 1 rank)."""
    world = dist.get_world_size() if dist.is_initialized() else 1
    torch.manual_seed(seed)
    model = MLP(tuple(widths))
    mesh = init_device_mesh("cpu", (world,))
    for mod in (model.fc1, model.fc2, model.fc3):
        for name in ("weight", "bias"):
            p = getattr(mod, name)
            setattr(mod, name, torch.nn.Parameter(distribute_tensor(p.detach(), mesh, [Shard(0)])))
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, foreach=False)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule(steps))
    torch.manual_seed(seed + 1)  # dropout: the same stream on every rank
    random.seed(seed + 2)
    np.random.seed(seed + 3)
    return TrainState(model, opt, scheduler=sched, data=Batches(seed), parts=parts)


def _my_chunks(world: int, rank: int) -> range:
    per = CHUNKS // world
    return range(rank * per, (rank + 1) * per)


def set_gradients(
    state: Any, data: tuple[torch.Tensor, torch.Tensor], *, delay_s: float = 0.0
) -> torch.Tensor:
    """Draw the next batch, compute the gradients of this rank's chunks on the gathered weights,
    all-gather them, sum in chunk order and set each parameter's ``grad`` to this rank's shard.
    Returns the flat sum over chunks / CHUNKS: the whole gradient, then the loss (same on every
    rank). ``delay_s``: sleep before the exchange (a slow rank: a straggler)."""
    t0 = time.perf_counter()
    world = dist.get_world_size() if dist.is_initialized() else 1
    rank = dist.get_rank() if dist.is_initialized() else 0
    params = list(state.model.parameters())
    idx = state.data.next_indices()
    masks = (torch.rand(BATCH, 2 * state.model.widths[1]) >= DROPOUT).float()  # every rank
    full = [p.full_tensor().detach().requires_grad_() for p in params]  # all-gather (ZeRO-3)
    t_gathered = time.perf_counter()
    rows, local = BATCH // CHUNKS, []
    for c in _my_chunks(world, rank):
        sl = slice(c * rows, (c + 1) * rows)
        logits = forward(full, data[0][idx[sl]], masks[sl])
        loss = torch.nn.functional.cross_entropy(logits, data[1][idx[sl]])
        grads = torch.autograd.grad(loss, full)
        local.append(torch.cat([g.reshape(-1) for g in grads] + [loss.detach().reshape(1)]))
    mine = torch.stack(local)  # (chunks per rank, params + 1)
    if delay_s:
        time.sleep(delay_s)
    t_work = time.perf_counter() - t_gathered  # own work: after the gather, before the exchange
    if world > 1:
        parts = [torch.empty_like(mine) for _ in range(world)]
        dist.all_gather(parts, mine)
        mine = torch.cat(parts)  # (CHUNKS, params + 1), in chunk order
    total = mine.sum(dim=0) / CHUNKS
    offset = 0
    for p in params:
        g = total[offset : offset + p.numel()].reshape(p.shape)
        offset += p.numel()
        shard = torch.chunk(g, world, dim=0)[rank].contiguous()
        p.grad = DTensor.from_local(
            shard, p.device_mesh, p.placements, run_check=False, shape=p.shape, stride=p.stride()
        )
    state.timing = {"work_s": t_work, "step_s": time.perf_counter() - t0}
    return total


def train_step(
    state: Any, data: tuple[torch.Tensor, torch.Tensor], *, delay_s: float = 0.0
) -> float:
    """One step: :func:`set_gradients`, then AdamW on this rank's shards and the schedule.
    Returns the global batch's loss (the same on every rank). ``state.timing``: this rank's
    seconds of work before the exchange and of the whole step."""
    t0 = time.perf_counter()
    total = set_gradients(state, data, delay_s=delay_s)
    state.optimizer.step()
    state.optimizer.zero_grad(set_to_none=True)
    state.scheduler.step()
    state.step += 1
    state.timing["step_s"] = time.perf_counter() - t0
    return float(total[-1])


def full_weights(state: Any) -> torch.Tensor:
    """Every weight gathered into one flat fp32 vector (to compare runs bit for bit)."""
    return torch.cat([p.full_tensor().detach().reshape(-1) for p in state.model.parameters()])


def steps_until(
    state: Any, data, stop: int, *, delay_s: float = 0.0
) -> Iterator[tuple[int, float]]:
    """Train until ``state.step == stop``, yielding (step, loss) after each step."""
    while state.step < stop:
        loss = train_step(state, data, delay_s=delay_s)
        yield state.step, loss
