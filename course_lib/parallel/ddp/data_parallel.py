"""DataParallel: gradients averaged over ranks in buckets launched during backward, and the
naive one-all-reduce-per-parameter version beside it."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import nn

from course_lib import validate
from course_lib.runtime.groups import Group, GroupInfo, group_info

__all__ = ["DataParallel", "allreduce_gradients", "broadcast_parameters", "assign_buckets"]

MiB = 1024 * 1024  # bucket_cap_mb is in MiB, as in torch's DDP (its _MB_TO_BYTES)


class BucketTracker(Protocol):
    """What ``DataParallel(recorder=...)`` is told of each bucket's all-reduce at its launch
    (``measure.timeline.StepRecorder`` is one)."""

    def track(self, index: int, nbytes: int, future: torch.futures.Future[Any]) -> None: ...


def _dp_group(group: Group) -> GroupInfo:
    return group_info(group, needs="data parallelism")


@torch.no_grad()
def broadcast_parameters(module: nn.Module, group: Group = None) -> None:
    """Copy rank 0's parameters and buffers to every rank of ``group`` (one broadcast each),
    so all replicas start from the same model."""
    root = _dp_group(group).root  # broadcast names its source by global rank
    for t in [*module.parameters(), *module.buffers()]:
        dist.broadcast(t.data, src=root, group=group)


def allreduce_gradients(module: nn.Module, group: Group = None) -> int:
    """The naive version: after backward, average every gradient over ``group``, one blocking
    all-reduce per parameter. Returns the number of all-reduce calls it made."""
    world_size = _dp_group(group).world_size
    calls = 0
    for p in module.parameters():
        if p.grad is not None:
            p.grad.div_(world_size)  # sum of g / N = the mean (what DDP's default hook does)
            dist.all_reduce(p.grad, group=group)
            calls += 1
    return calls


def assign_buckets(
    named_params: Sequence[tuple[str, torch.Tensor]], cap_bytes: int
) -> list[list[str]]:
    """Parameter names per bucket. Parameters are taken in reverse registration order (the
    order backward produces their gradients); a parameter joins the open bucket, and the bucket
    closes once it holds ``cap_bytes`` or more (torch's ``_compute_bucket_assignment_by_size``
    rule: a bucket may exceed the cap by its last parameter, and a parameter larger than the
    cap gets a bucket of its own)."""
    cap_bytes = validate.count("cap_bytes", cap_bytes, minimum=1)
    buckets: list[list[str]] = []
    current: list[str] = []
    size = 0
    for name, p in reversed(named_params):
        current.append(name)
        size += p.numel() * p.element_size()
        if size >= cap_bytes:
            buckets.append(current)
            current, size = [], 0
    if current:
        buckets.append(current)
    return buckets


@dataclass
class _Bucket:
    index: int
    params: list[nn.Parameter]
    arrived: int = 0  # gradients accumulated this backward
    flat: torch.Tensor | None = None  # (sum of numels,) the averaged gradients, once launched
    work: dist.Work | None = None  # the async all-reduce's handle
    numels: list[int] = field(default_factory=list)


class DataParallel(nn.Module):
    """Wrap ``module`` for data parallelism over ``group`` (default: all ranks).

    At construction the parameters and buffers are broadcast from the group's rank 0 and the
    parameters are assigned to buckets of ``bucket_cap_mb`` MiB (``.buckets``: the parameter
    names in each bucket, in launch order). During ``loss.backward()`` every full bucket is
    all-reduced asynchronously; when ``backward()`` returns every ``.grad`` holds the mean over
    ranks. Inside ``with model.no_sync():`` nothing is communicated and gradients accumulate
    locally; the first backward outside it averages the accumulated sum.

    ``recorder``: optional, an object with ``track(index, nbytes, future)`` (e.g.
    ``measure.timeline.StepRecorder``), told about each bucket's all-reduce when it is launched,
    to draw the overlap of communication with backward.
    """

    def __init__(
        self,
        module: nn.Module,
        *,
        group: Group = None,
        bucket_cap_mb: float = 25.0,
        recorder: BucketTracker | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(module, nn.Module):
            raise TypeError(f"module = {validate.describe(module)}: expected a torch.nn.Module")
        self.bucket_cap_mb = validate.number("bucket_cap_mb", bucket_cap_mb, positive=True)
        cap_bytes = max(1, int(self.bucket_cap_mb * MiB))
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        if not named:
            raise ValueError(
                "module: expected a parameter that requires a gradient (it has no parameter "
                "that does: nothing to average)"
            )
        kinds = {(p.dtype, p.device) for _, p in named}
        if len(kinds) > 1:
            raise ValueError(
                f"module = parameters of dtypes/devices {sorted(map(str, kinds))}: expected "
                "one dtype and device (a bucket is one flat tensor); cast the module first"
            )
        if recorder is not None and not callable(getattr(recorder, "track", None)):
            raise TypeError(
                f"recorder = {validate.describe(recorder)}: expected None or an "
                "object with a track(index, nbytes, future) method"
            )
        self.module, self.group, self.recorder = module, group, recorder
        self.world_size = _dp_group(group).world_size
        broadcast_parameters(module, group)  # every replica starts from rank 0's model

        self.buckets: list[list[str]] = assign_buckets(named, cap_bytes)
        by_name = dict(named)
        self._buckets = [
            _Bucket(i, [by_name[n] for n in names]) for i, names in enumerate(self.buckets)
        ]
        for b in self._buckets:
            b.numels = [p.numel() for p in b.params]
            for p in b.params:  # torch's stub leaves this method untyped
                p.register_post_accumulate_grad_hook(self._make_hook(b))
        self.require_sync = True  # False inside no_sync()
        self._next = 0  # the next bucket to launch: buckets go out in order on every rank
        self._in_backward = False

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes inside the block only accumulate local gradients (no all-reduce)."""
        previous, self.require_sync = self.require_sync, False
        try:
            yield
        finally:
            self.require_sync = previous

    # ---- during backward --------------------------------------------------------------------
    def _make_hook(self, bucket: _Bucket) -> Callable[[torch.Tensor], None]:
        def hook(param: torch.Tensor) -> None:  # runs once p.grad holds this backward's sum
            if not self.require_sync:
                return
            if not self._in_backward:  # first gradient of this backward: wait at its end
                self._in_backward = True
                torch.autograd.Variable._execution_engine.queue_callback(self._finish)
            bucket.arrived += 1
            self._launch_ready()

        return hook

    def _launch_ready(self) -> None:
        while self._next < len(self._buckets) and self._buckets[self._next].arrived == len(
            self._buckets[self._next].params
        ):
            b = self._buckets[self._next]
            flat = torch.cat([_grad(p).reshape(-1) for p in b.params])  # (sum of numels,)
            b.flat = flat.div_(self.world_size)  # all-reduce sums; sum of g / N is the mean
            b.work = dist.all_reduce(flat, group=self.group, async_op=True)  # backward goes on
            if self.recorder is not None and b.work is not None:
                nbytes = flat.numel() * flat.element_size()
                self.recorder.track(b.index, nbytes, b.work.get_future())
            self._next += 1

    def _finish(self) -> None:
        """End of backward: wait for every bucket, copy the averages into ``.grad``, reset."""
        missing = [
            name
            for names, b in zip(self.buckets, self._buckets)
            for name, p in zip(names, b.params)
            if b.work is None and p.grad is None
        ]
        try:
            if self._next < len(self._buckets):
                raise RuntimeError(
                    f"backward ended with buckets {self._next}..{len(self._buckets) - 1} not "
                    f"all-reduced: parameters {missing or '(some)'} got no gradient. Every "
                    "parameter must take part in the loss on every rank (torch's DDP needs "
                    "find_unused_parameters=True for models that skip some)"
                )
            for b in self._buckets:
                assert b.work is not None and b.flat is not None  # every bucket was launched
                b.work.wait()
                for p, g in zip(b.params, torch.split(b.flat, b.numels)):
                    _grad(p).copy_(g.view_as(p))
        finally:
            for b in self._buckets:
                b.arrived, b.flat, b.work = 0, None, None
            self._next, self._in_backward = 0, False


def _grad(p: torch.Tensor) -> torch.Tensor:
    """``p.grad``, which a bucket's hooks only read once backward has produced it."""
    assert p.grad is not None
    return p.grad
