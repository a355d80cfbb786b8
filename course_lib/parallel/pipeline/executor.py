"""Running one pipeline step: a rank's list of actions (F or B of a micro-batch on a stage)
executed with point-to-point messages. The schedules are in ``pipeline.py``, the timeline in
``trace.py``.

Sends are ``isend`` (waited at the end of the step): a blocking send in both directions between
two 1F1B stages could deadlock. Every message has its own tag (kind, stage, micro-batch), so a
receive can never take a message meant for another. The loss of micro-batch i is divided by m
before backward, so the accumulated gradients are those of the full-batch mean.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

import torch
import torch.distributed as dist
from torch import nn

from course_lib import validate
from course_lib.measure.timing import EventLog
from course_lib.parallel.pipeline.rank import Action, PipelineRank
from course_lib.parallel.pipeline.trace import StepTracer

__all__ = ["run_schedule"]

Kind = Literal["F", "B"]


def _tag(kind: Kind, stage: int, microbatch: int, microbatches: int) -> int:
    # one tag per message: activations into stage k ("F") or gradients out of stage k ("B")
    return (2 * stage + (kind == "B")) * microbatches + microbatch


class _Step:
    """One rank's state during a step: what forward saved for backward, the messages between
    stages, the sends still in flight, the loss so far."""

    def __init__(
        self,
        model: PipelineRank,
        m: int,
        shape: torch.Size,
        dtype: torch.dtype,
        tracer: StepTracer,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    ) -> None:
        self.model, self.m, self.shape, self.dtype, self.tracer = model, m, shape, dtype, tracer
        self.loss_fn = loss_fn
        self.last = len(model.split) - 1
        self.saved: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
        self.mailbox: dict[int, torch.Tensor] = {}  # messages to a stage on this same rank
        self.sends: list[tuple[dist.Work, torch.Tensor]] = []  # keep t alive until waited
        self.total: torch.Tensor | None = None
        self.in_flight: dict[int, int] = {k: 0 for k in model.stage_ids}
        model.max_in_flight = {k: 0 for k in model.stage_ids}

    # ---- messages -----------------------------------------------------------------------------
    def receive(self, kind: Kind, stage: int, mb: int, src: int) -> torch.Tensor:
        tag = _tag(kind, stage, mb, self.m)
        if src == self.model.rank:
            return self.mailbox.pop(tag)
        buf = torch.empty(self.shape, dtype=self.dtype)  # (b/m, ...)
        start = self.tracer.now()
        dist.recv(buf, src=src, tag=tag)
        self.tracer.wait(kind, mb, stage, start)
        return buf

    def send(self, t: torch.Tensor, kind: Kind, stage: int, mb: int, dst: int) -> None:
        tag = _tag(kind, stage, mb, self.m)
        if dst == self.model.rank:
            self.mailbox[tag] = t
            return
        work = dist.isend(t, dst=dst, tag=tag)
        assert work is not None  # isend always returns its Work
        self.sends.append((work, t))

    def release_sent(self, *, wait: bool = False) -> None:
        """Forget the sends that completed (all of them, waiting, with ``wait``)."""
        pending = []
        for work, t in self.sends:
            if wait or work.is_completed():
                work.wait()
            else:
                pending.append((work, t))
        self.sends = pending

    # ---- the two actions ----------------------------------------------------------------------
    def forward(self, k: int, mb: int, x: torch.Tensor | None, y: torch.Tensor | None) -> None:
        model, owner = self.model, self.model.owner
        if k == 0:
            if x is None:
                raise ValueError(f"x = None: expected the batch on rank {model.rank} (stage 0)")
            inp = x
        else:
            inp = self.receive("F", k, mb, owner(k - 1, model.ranks))
        start = self.tracer.now()
        inp = inp.detach().requires_grad_(k > 0)
        out = model.stages[str(k)](inp)  # (b/m, ...)
        if k == self.last:
            if y is None:
                raise ValueError(
                    f"y = None: expected the targets on rank {model.rank} (last stage)"
                )
            out = self.loss_fn(out, y) / self.m  # the batch mean, one micro-batch at a time
            self.total = out.detach() if self.total is None else self.total + out.detach()
        self.saved[(k, mb)] = (inp, out)
        self.in_flight[k] += 1
        model.max_in_flight[k] = max(model.max_in_flight[k], self.in_flight[k])
        self.tracer.compute("F", mb, k, start)
        if k < self.last:
            self.send(out.detach(), "F", k + 1, mb, owner(k + 1, model.ranks))

    def backward(self, k: int, mb: int) -> None:
        model, owner = self.model, self.model.owner
        inp, out = self.saved.pop((k, mb))
        grad = None if k == self.last else self.receive("B", k, mb, owner(k + 1, model.ranks))
        start = self.tracer.now()
        torch.autograd.backward(out, grad)  # accumulates into the stage's .grad
        self.in_flight[k] -= 1
        self.tracer.compute("B", mb, k, start)
        if k > 0:
            assert inp.grad is not None
            self.send(inp.grad, "B", k - 1, mb, owner(k - 1, model.ranks))


def _message_shape(
    model: nn.Module,
    x: torch.Tensor | None,
    y: torch.Tensor | None,
    m: int,
    message_shape: Sequence[int] | None,
) -> tuple[torch.Size, torch.dtype]:
    """Shape and dtype of one received message: a micro-batch's unless ``message_shape``."""
    batch = x if x is not None else y
    if batch is None:
        raise ValueError(
            "x = None and y = None: expected the batch or the targets (they give "
            "the shape of the micro-batches this rank receives)"
        )
    shape = batch.chunk(m)[0].shape if message_shape is None else torch.Size(message_shape)
    return shape, next(model.parameters()).dtype


def run_schedule(
    model: PipelineRank,
    actions: Sequence[Action],
    x: torch.Tensor | None,
    y: torch.Tensor | None,
    *,
    microbatches: int,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    log: EventLog | None = None,
    message_shape: Sequence[int] | None = None,
) -> torch.Tensor | None:
    """Run this rank's ``actions`` for one batch and leave the gradients in ``.grad``.

    ``x`` (b, ...) is the batch, read by the rank of stage 0; ``y`` the targets, read by the
    rank of the last stage; both are cut into ``microbatches`` equal micro-batches. Every
    stage maps (b/m, ...) to the same shape; a rank that holds neither end passes one of them
    anyway (it gives the shape of the messages it receives). Returns the batch loss (the mean of the
    micro-batch losses) on the rank of the last stage, None elsewhere. ``log``: each F/B is
    recorded as a span (lane "compute"; meta stage, microbatch, kind) and each wait for a
    message as a span (lane "wait"), on the EventLog's shared clock. ``message_shape``: the
    shape of one received message (activation or its gradient) when it is not that of a
    micro-batch of ``x``, e.g. a first stage that embeds (b, s) token ids into (b, s, h).
    """
    m = microbatches
    shape, dtype = _message_shape(model, x, y, m, message_shape)
    xs, ys = (x.chunk(m) if x is not None else None), (y.chunk(m) if y is not None else None)
    step = _Step(model, m, shape, dtype, StepTracer(log), loss_fn)
    for kind, mb, k in actions:
        if str(k) not in model.stages:
            raise ValueError(
                f"actions = {validate.describe(actions)}: expected actions on the stages rank "
                f"{model.rank} holds ({model.stage_ids}); it was given {kind}{mb} of stage {k}"
            )
        step.release_sent()
        if kind == "F":
            step.forward(k, mb, xs[mb] if xs else None, ys[mb] if ys else None)
        else:
            step.backward(k, mb)
    step.release_sent(wait=True)
    if step.saved:
        raise RuntimeError(
            f"schedule left micro-batches {sorted(step.saved)} without a backward "
            "(stage, micro-batch): every F needs its B"
        )
    return step.total  # the batch loss (last stage only)
