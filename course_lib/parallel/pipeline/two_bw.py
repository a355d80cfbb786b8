"""Weight versions of a pipeline without flushes (PipeDream-2BW), executed exactly in one process.

Narayanan et al. 2021, "Memory-Efficient Pipeline-Parallel DNN Training" (arXiv:2006.09503):
a 1F1B pipeline that never drains keeps starting micro-batches of the next batch while those of
the previous one are still going backward. A micro-batch's backward must use the weights its
forward used (*weight stashing*), so a stage holds several weight versions at once. Three
policies, all on the same per-stage 1F1B orders (:func:`~course_lib.parallel.pipeline.
one_f_one_b_order`, the orders the multi-rank executor runs):

* ``"flush"`` (GPipe, PipeDream-Flush/1F1B): the pipeline drains after every batch of m
  micro-batches and every stage updates once: one weight version, W(t+1) = W(t) - lr g(W(t)).
* ``"2bw"`` (PipeDream-2BW, Sec. 3.1): no flush. Every stage accumulates the gradients of a batch
  and makes a new version when that batch's last backward has run there; the micro-batches of
  batch t use version W(t-1) in forward and backward (W(-1) = W(0)): two versions are alive, and
  W(t+1) = W(t) - lr g(W(t-1)), an update delayed by one step. It needs m >= p (the micro-batches
  of batch t+1 start only once batch t-1 is done on the stage; checked as it runs).
* ``"pipedream"`` (the original PipeDream, weight stashing with an update per micro-batch): every
  micro-batch in flight keeps the version its forward used: up to p - s versions on stage s.

:func:`run_versions` executes the actions one by one in a valid global order (a stage's next
action runs when its input has arrived), so every tensor kept is a real tensor of this process:
the bytes of the versions are counted from their storages after every action.
Introduced in notebooks/12_pipeline_parallelism.ipynb.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.func import functional_call

from course_lib import validate
from course_lib.parallel.pipeline.rank import Action
from course_lib.parallel.pipeline.schedules import one_f_one_b_order

__all__ = ["POLICIES", "VersionRun", "run_versions"]

POLICIES = ("flush", "2bw", "pipedream")

Batch = tuple[torch.Tensor, torch.Tensor]
Params = dict[str, torch.Tensor]
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class VersionRun:
    """What :func:`run_versions` measured. ``weights[s]``: stage s's newest version;
    ``losses[t]``: batch t's loss (mean over its micro-batches, with the weights they used);
    ``peak_bytes[s]`` / ``peak_versions[s]``: most bytes / distinct versions of stage s's
    weights alive after any action; ``used[(s, j)]``: (forward version, backward version) of
    micro-batch j on stage s."""

    weights: list[Params]
    losses: list[float]
    peak_bytes: list[int]
    peak_versions: list[int]
    used: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict)


class _Stage:
    """One stage's module, its weight versions and the micro-batches in flight."""

    def __init__(self, module: nn.Module, policy: str) -> None:
        self.module, self.policy = module, policy
        self.versions: dict[int, Params] = {
            0: {n: p.detach() for n, p in module.named_parameters()}
        }
        self.newest = 0
        self.flight: dict[int, tuple[int, torch.Tensor, Params, torch.Tensor]] = {}
        self.grads: dict[int, Params] = {}  # batch -> accumulated gradients
        self.done: dict[int, int] = {}  # batch -> backwards run
        self.peak_bytes = self.peak_versions = 0

    def measure(self) -> None:
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                    for v in self.versions.values() for t in v.values()}  # fmt: skip
        self.peak_bytes = max(self.peak_bytes, sum(storages.values()))
        self.peak_versions = max(self.peak_versions, len(self.versions))

    def version_for(self, batch: int) -> int:
        if self.policy == "2bw":
            wanted = max(batch - 1, 0)
            if wanted not in self.versions:
                raise RuntimeError(f"version {wanted} is not made yet: expected m >= p")
            return wanted
        return self.newest  # flush: the only one; pipedream: the latest

    def forward(self, j: int, batch: int, x: torch.Tensor, first: bool) -> torch.Tensor:
        v = self.version_for(batch)
        leaves = {n: t.detach().requires_grad_() for n, t in self.versions[v].items()}  # no copy
        x = x.detach().requires_grad_(not first)  # the first stage's input needs no gradient
        out: torch.Tensor = functional_call(self.module, leaves, (x,))
        self.flight[j] = (v, x, leaves, out)
        return out

    def backward(
        self, j: int, batch: int, grad_out: torch.Tensor | None
    ) -> tuple[int, torch.Tensor]:
        """Backward of micro-batch j (``grad_out`` None: ``out`` is the loss); returns the
        version it used and the gradient of its input."""
        v, x, leaves, out = self.flight.pop(j)
        inputs = [x, *leaves.values()] if x.requires_grad else list(leaves.values())
        got = torch.autograd.grad(out, inputs, grad_out)
        gx = got[0] if x.requires_grad else torch.zeros(0)
        grads = dict(zip(leaves, got[-len(leaves) :]))
        acc = self.grads.setdefault(batch if self.policy != "pipedream" else j, {})
        for n, g in grads.items():
            acc[n] = g if n not in acc else acc[n] + g
        return v, gx

    @torch.no_grad()
    def update(self, key: int, lr: float, *, keep_from: int) -> None:
        """A new version: the newest minus lr x the gradients of ``key``; drop versions older
        than ``keep_from`` that no micro-batch in flight uses."""
        g = self.grads.pop(key)
        new = {n: t - lr * g[n] for n, t in self.versions[self.newest].items()}
        self.newest += 1
        self.versions[self.newest] = new
        busy = {v for v, *_ in self.flight.values()}
        for v in [v for v in self.versions if v < keep_from and v not in busy]:
            del self.versions[v]


def run_versions(
    layers: nn.Sequential,
    split: Sequence[range],
    batches: Sequence[Batch],
    *,
    microbatches: int,
    policy: str = "2bw",
    lr: float = 0.1,
    loss_fn: LossFn = nn.functional.mse_loss,
) -> VersionRun:
    """SGD on ``batches`` (each split into ``microbatches`` equal micro-batches) through the
    stages ``split`` of ``layers`` (their own parameters are left untouched), under ``policy``
    (module docstring). Returns a :class:`VersionRun`."""
    policy = validate.choice("policy", policy, POLICIES)
    m = validate.count("microbatches", microbatches, minimum=1)
    validate.number("lr", lr, minimum=0)
    p = len(split)
    if policy != "flush" and m < p:
        raise ValueError(f"microbatches = {m}: expected at least {p} (the stages) without flushes")
    stages = [_Stage(nn.Sequential(*[layers[i] for i in r]), policy) for r in split]
    for k, (xb, _) in enumerate(batches):
        if xb.shape[0] % m:  # equal micro-batches: the mean of their losses is the batch's
            raise ValueError(f"microbatches = {m}: expected a divisor of batch {k}'s rows")
    micro = [(x, y) for xb, yb in batches for x, y in zip(xb.chunk(m), yb.chunk(m))]
    run = VersionRun([], [0.0] * len(batches), [], [])
    rounds = [(0, len(micro))] if policy != "flush" else [(t * m, m) for t in range(len(batches))]
    for first, count in rounds:
        orders = [one_f_one_b_order(s, p, count) for s in range(p)]
        _execute(stages, orders, first, micro, m, lr, loss_fn, run)
        if policy == "flush":  # the pipeline has drained: every stage updates once
            for st in stages:
                st.update(first // m, lr, keep_from=st.newest + 1)
                st.measure()
    run.weights = [dict(st.versions[st.newest]) for st in stages]
    run.peak_bytes = [st.peak_bytes for st in stages]
    run.peak_versions = [st.peak_versions for st in stages]
    return run


def _execute(
    stages: list[_Stage],
    orders: list[list[Action]],
    first: int,
    micro: Sequence[Batch],
    m: int,
    lr: float,
    loss_fn: LossFn,
    run: VersionRun,
) -> None:
    """Run every stage's ``orders`` (micro-batch i is ``micro[first + i]``), each action as
    soon as its input is there: activations forward, gradients backward."""
    p = len(stages)
    acts: dict[tuple[int, int], torch.Tensor] = {}  # (stage, j) -> sent to the next stage
    grads: dict[tuple[int, int], torch.Tensor] = {}  # (stage, j) -> sent to the previous one
    pos = [0] * p
    while any(pos[s] < len(orders[s]) for s in range(p)):
        moved = False
        for s, st in enumerate(stages):
            if pos[s] == len(orders[s]):
                continue
            kind, i, _ = orders[s][pos[s]]
            j, t = first + i, (first + i) // m
            if kind == "F" and (s == 0 or (s - 1, j) in acts):
                x = micro[j][0] if s == 0 else acts.pop((s - 1, j))
                out = st.forward(j, t, x, s == 0)
                if s == p - 1:  # the loss, as a mean over the batch of its micro-batches
                    loss = loss_fn(out, micro[j][1]) / m
                    run.losses[t] += float(loss.detach())
                    st.flight[j] = (*st.flight[j][:3], loss)
                else:
                    acts[(s, j)] = out.detach()
            elif kind == "B" and (s == p - 1 or (s + 1, j) in grads):
                v_f = st.flight[j][0]
                v_b, gx = st.backward(j, t, None if s == p - 1 else grads.pop((s + 1, j)))
                run.used[(s, j)] = (v_f, v_b)
                if s > 0:
                    grads[(s, j)] = gx
                _after_backward(st, j, t, m, lr)
            else:
                continue
            st.measure()
            pos[s], moved = pos[s] + 1, True
        if not moved:
            raise RuntimeError("the stages' orders wait on each other (no action can run)")


def _after_backward(st: _Stage, j: int, t: int, m: int, lr: float) -> None:
    """2BW: a batch's last backward on this stage makes a new version; PipeDream: every one."""
    if st.policy == "pipedream":
        st.update(j, lr, keep_from=st.newest + 1)
    elif st.policy == "2bw":
        st.done[t] = st.done.get(t, 0) + 1
        if st.done[t] == m:
            st.update(t, lr, keep_from=t)
