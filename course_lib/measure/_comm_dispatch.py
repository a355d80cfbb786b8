"""The operators CommMeter sees through PyTorch's CommDebugMode (a TorchDispatchMode).

Functional collectives (``torch.distributed._functional_collectives``, used by DTensor) and c10d
operators issued from C++ (DDP's reducer) never pass through a Python ``torch.distributed``
function that CommMeter could wrap; the dispatcher sees them. This module turns such an
operator call into (torch.distributed name, payload bytes, group size) for
``course_lib.measure.comm``. Introduced in notebooks/08_collectives.ipynb.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from course_lib.runtime.groups import group_info

__all__ = ["make_dispatch_mode", "describe_dispatch", "nbytes"]

# operator names (overload packet, trailing "_" removed) -> the torch.distributed function name
_DISPATCH_NAMES = {
    "allreduce": "all_reduce",
    "allreduce_coalesced": "all_reduce",
    "all_reduce_coalesced": "all_reduce",
    "allgather": "all_gather",
    "allgather_coalesced": "all_gather",
    "_allgather_base": "all_gather_into_tensor",
    "allgather_into_tensor_coalesced": "all_gather_into_tensor",
    "all_gather_into_tensor_coalesced": "all_gather_into_tensor",
    "_reduce_scatter_base": "reduce_scatter_tensor",
    "reduce_scatter_tensor_coalesced": "reduce_scatter_tensor",
    "alltoall": "all_to_all",
    "alltoall_base": "all_to_all_single",
    "shard_dim_alltoall": "all_to_all",
}


def nbytes(obj: Any) -> int:
    """Bytes of a tensor, or of the tensors in a (nested) list or tuple; 0 for anything else."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, (list, tuple)):
        return sum(nbytes(o) for o in obj)
    return 0


def make_dispatch_mode(meter):
    """A CommDebugMode that also hands every communication operator to
    ``meter._record_dispatch(func, args, kwargs, api)``, unless a wrapped Python call of the
    meter is running (``meter._depth > 0``: that call records it)."""
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.distributed.tensor.debug._comm_mode import c10d_collective_ops

    class _Mode(CommDebugMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = super().__torch_dispatch__(func, types, args, kwargs)
            if out is NotImplemented or meter._depth > 0:
                return out  # a wrapped Python call already recorded it
            packet = getattr(func, "_overloadpacket", None)
            if packet in self.comm_registry:
                meter._record_dispatch(func, args, kwargs or {}, "functional")
            elif packet in c10d_collective_ops:
                meter._record_dispatch(func, args, kwargs or {}, "dispatch")
            return out

    return _Mode()


def describe_dispatch(func, args, api: str) -> tuple[str, int, int]:
    """(torch.distributed name, payload bytes, group size) of one dispatched operator call."""
    name = str(getattr(func, "_overloadpacket", func)).split(".")[-1].rstrip("_")
    base = _DISPATCH_NAMES.get(name, name)
    if api == "dispatch":
        # c10d operators take (outputs, inputs, ...) except the in-place ones
        in_place = base in ("all_reduce", "broadcast", "reduce")
        return base, nbytes(args[0] if in_place else args[1]), _group_size(args)
    ints = [a for a in args[1:] if isinstance(a, int) and not isinstance(a, bool)]
    n = (
        ints[0]
        if base in ("all_gather_into_tensor", "reduce_scatter_tensor") and ints
        else _group_size(args)
    )
    return base, nbytes(args[0]), n


def _group_size(args) -> int:
    for a in args:
        if isinstance(a, dist.ProcessGroup):
            return a.size()
        if isinstance(a, str):  # functional collectives name their group
            try:
                # the name functional collectives pass is the str torch types as GroupName
                return dist.distributed_c10d._resolve_process_group(a).size()  # type: ignore[arg-type]
            except Exception:
                continue
    return group_info(needs="CommMeter", single=True).world_size  # the default group
