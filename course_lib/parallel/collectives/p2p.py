"""The point-to-point pieces the from-scratch collectives are built from (``collectives.py``,
``pairwise.py``): argument checks, one exchange with a peer, the flat view of a
tensor, and the step-by-step record the lecture draws."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from course_lib import validate
from course_lib.runtime.groups import Group, GroupInfo, global_rank, group_info

__all__ = [
    "chunk_sizes",
    "check_tensor",
    "check_same_dtype",
    "collective_group",
    "exchange",
    "wait",
    "contiguous_flat",
    "snapshot",
]


def chunk_sizes(numel: int, world_size: int) -> list[int]:
    """Element count of each of the ``world_size`` ring chunks of a tensor with ``numel`` elements.

    Same split as ``torch.tensor_split(flat, world_size)``: the first ``numel % world_size``
    chunks hold one extra element.
    """
    world_size = validate.count("world_size", world_size, minimum=1)
    numel = validate.count("numel", numel, minimum=0)
    base, extra = divmod(numel, world_size)
    return [base + (1 if i < extra else 0) for i in range(world_size)]


def check_tensor(name: str, tensor: Any) -> None:
    """Refuse anything but a floating-point tensor (the collectives sum)."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{name} = {validate.describe(tensor)}: expected a torch.Tensor")
    if not tensor.dtype.is_floating_point:
        raise TypeError(
            f"{name}.dtype = {tensor.dtype}: expected a floating-point dtype "
            "(float16, bfloat16, float32, float64)"
        )


def check_same_dtype(input: torch.Tensor, output: torch.Tensor) -> None:
    """Refuse an ``output`` of another dtype than ``input``."""
    if input.dtype != output.dtype:
        raise TypeError(
            f"output.dtype = {output.dtype}: expected input's dtype, {input.dtype} "
            "(input and output dtypes differ)"
        )


def collective_group(group: Group) -> GroupInfo:
    """This rank's place in ``group``; refuses to run outside a process group."""
    return group_info(group, needs="a collective")


def exchange(
    send_buf: torch.Tensor, dst: int, recv_buf: torch.Tensor, src: int, group: Group
) -> None:
    """Send ``send_buf`` to ``dst`` while receiving ``recv_buf`` from ``src`` (group ranks).

    Both operations are posted before waiting on either: a blocking send then receive around a
    ring deadlocks (see ``collectives.py``). ``dist.isend`` is looked up at call time so that
    course_lib.measure.comm.CommMeter sees it.
    """
    # Post the receive first: some transports match a message faster when its receive is waiting.
    recv_req = dist.irecv(recv_buf, global_rank(group, src), group=group)
    send_req = dist.isend(send_buf, global_rank(group, dst), group=group)
    wait(send_req, recv_req)


def wait(*requests: dist.Work | None) -> None:
    """Wait for each request, in order (torch types ``isend``/``irecv`` as maybe None)."""
    for req in requests:
        if req is not None:
            req.wait()


def contiguous_flat(tensor: torch.Tensor) -> torch.Tensor:
    """A flat contiguous view of ``tensor`` (a copy only when ``tensor`` is not contiguous)."""
    return tensor.view(-1) if tensor.is_contiguous() else tensor.contiguous().view(-1)


def snapshot(record: list[dict[str, Any]] | None, **info: Any) -> None:
    """Append one step of a collective to ``record`` (with a copy of the state), if given."""
    if record is not None:
        info["state"] = info["state"].detach().clone()
        record.append(info)
