"""The timeline of one data-parallel step on one rank: backward compute and bucket all-reduces.

A :class:`StepRecorder` hooks a model's layers and serves as DDP's communication hook, and
records on the shared clock of :class:`~course_lib.measure.timing.EventLog` when each layer's
backward runs and when each gradient bucket's all-reduce starts and ends. Merged over ranks
(``merge_event_logs``), that is the Gantt chart showing how much communication backward hides.
Introduced in notebooks/13_interconnects_and_backends.ipynb; units 09, 10 and 12 draw their
timelines from it.
"""

from __future__ import annotations

import functools

import torch.distributed as dist

from course_lib.measure.timing import EventLog

__all__ = ["StepRecorder"]


class StepRecorder:
    """The timeline of one DDP step on one rank, recorded with measure.timing.EventLog.

    ``comm_hook`` is DDP's default hook (allreduce_hook: all-reduce the bucket, divide by the
    world size) with a stopwatch: a bucket's span starts when DDP hands it over and ends in the
    future's callback, when the all-reduce is done. A layer's backward span starts when its output
    gradient arrives (module backward pre-hook) and ends when its last parameter gradient is
    accumulated, the moment DDP's own autograd hook marks it ready. (A full backward hook would
    misfire on layer 0, whose input needs no gradient.)
    """

    def __init__(self, rank: int, world_size: int, layers) -> None:
        self.rank, self.world_size = rank, world_size
        self.n_params = {}
        for i, layer in enumerate(layers):
            params = list(layer.parameters())
            self.n_params[i] = len(params)
            layer.register_full_backward_pre_hook(functools.partial(self._layer_start, i))
            for p in params:
                p.register_post_accumulate_grad_hook(functools.partial(self._layer_end, i))
        self.new_step()

    def new_step(self) -> None:
        self.log = EventLog(self.rank)
        self.calls: list[int] = []  # bytes of each bucket, in the order DDP handed them over
        self._started: dict[int, int] = {}
        self._remaining: dict[int, int] = {}

    def _layer_start(self, i: int, module, grad_output) -> None:
        self._started[i], self._remaining[i] = self.log.now_ns(), self.n_params[i]

    def _layer_end(self, i: int, param) -> None:
        self._remaining[i] -= 1
        if self._remaining[i] == 0:  # weight and bias both accumulated
            self.log.add(f"backward L{i}", self._started[i], self.log.now_ns(), lane="compute")

    def track(self, index: int, nbytes: int, fut):
        """Record bucket ``index``'s all-reduce of ``nbytes``, launched now, ending when ``fut``
        completes (the callback runs on the backend's thread, gloo's or NCCL's). Returns the
        future of that callback (its value: ``fut``'s). Used by ``parallel.ddp.DataParallel``."""
        log, start = self.log, self.log.now_ns()
        self.calls.append(nbytes)

        def done(f):
            log.add(f"bucket {index}", start, log.now_ns(), lane="comm", bytes=nbytes)
            return f.value()

        return fut.then(done)

    def comm_hook(self, state, bucket):
        buf = bucket.buffer()
        fut = dist.all_reduce(buf, async_op=True).get_future()
        fut = self.track(bucket.index(), buf.numel() * buf.element_size(), fut)
        return fut.then(lambda f: f.value()[0].div_(self.world_size))
