"""The two private PyTorch details patched while a simulation runs, and the trackers' peak.

FSDP2's ``_chunk_with_empty`` builds its N chunks lazily (same views; 2x faster at 512 ranks),
and ``DeviceMesh._concatenate`` runs with fake mode off (2-D FSDP+TP needs a mesh made inside
fake mode). Both are restored when the block ends. Part of ``virtual/_rank.py``; introduced in
notebooks/10_zero_fsdp.ipynb.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from typing import Any

import torch


# ------------------------------------------------------------------------ fast sharding metadata
class _LazyChunks(Sequence):
    """``torch.chunk(t, n, dim)`` padded with empty tensors to ``n`` entries (what FSDP2's
    ``_chunk_with_empty`` returns), with each chunk made only when indexed.

    FSDP2 builds all ``world_size`` chunks of every parameter to keep one (``chunks[rank]``) and
    read one size (``chunks[0]``). Under FakeTensorMode each chunk is a fake tensor costing
    ~0.1 ms: at 512 ranks and 720 parameters that was 25 of 40 seconds. Same views, same order.
    """

    def __init__(self, tensor: torch.Tensor, num_chunks: int, dim: int):
        self.tensor, self.n, self.dim = tensor, num_chunks, dim
        size = tensor.size(dim)
        self.step = math.ceil(size / num_chunks)
        self.real = math.ceil(size / self.step)  # torch.chunk may return fewer than n chunks

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self.n))]
        if i < 0:
            i += self.n
        if not 0 <= i < self.n:
            raise IndexError(i)
        if i < self.real:
            start = i * self.step
            return self.tensor.narrow(
                self.dim, start, min(self.step, self.tensor.size(self.dim) - start)
            )
        return self[0].new_empty(0)


def lazy_chunk_with_empty(tensor: torch.Tensor, num_chunks: int, dim: int):
    if tensor.size(dim) == 0 or num_chunks <= 1:
        return list(torch.chunk(tensor, num_chunks, dim=dim)) or [tensor.new_empty(0)]
    return _LazyChunks(tensor, num_chunks, dim)


@contextlib.contextmanager
def meshes_outside_fake():
    """Let FSDP2 build its 2-D (dp, tp) mesh while FakeTensorMode is active.

    ``fully_shard`` on a tensor-parallel module concatenates the dp and tp meshes
    (``DeviceMesh._concatenate``, in ``FSDPParam._init_sharding_spec_tp``), and a new
    ``DeviceMesh`` finds its own coordinates with ``(mesh == rank).nonzero()``: under
    FakeTensorMode ``nonzero`` has no static output shape and raises
    ``DynamicOutputShapeException``. The mesh is bookkeeping on a tiny real tensor of rank ids,
    so it is built with fake mode switched off (``unset_fake_temporarily``); parameters,
    gradients and optimizer states stay fake.
    """
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.distributed.device_mesh import DeviceMesh

    original = DeviceMesh._concatenate

    def concatenate(device_mesh_list):
        with unset_fake_temporarily():
            return original(device_mesh_list)

    DeviceMesh._concatenate = staticmethod(concatenate)
    try:
        yield
    finally:
        DeviceMesh._concatenate = staticmethod(original)


@contextlib.contextmanager
def fast_fsdp_chunks():
    """Use :func:`lazy_chunk_with_empty` inside FSDP2 while the block runs (restored after)."""
    from torch.distributed.fsdp._fully_shard import _fsdp_param

    original = _fsdp_param._chunk_with_empty
    _fsdp_param._chunk_with_empty = lazy_chunk_with_empty
    try:
        yield
    finally:
        _fsdp_param._chunk_with_empty = original


#: the tracker categories that make the activation peak: tensors made in forward (and rebuilt
#: by checkpointing) and backward's scratch (activation gradients)
_ACTIVATION_KINDS = ("Activation", "Temp")


def global_peak_only(tracker_cls: Any) -> Any:
    """``tracker_cls`` whose per-operator peak update keeps only the global peak.

    MemTracker, after every operator, walks every module it knows to update the peaks of the
    active ones and deep-copies the snapshot at each new peak: O(modules) per operator, so
    O(layers^2) per step (~10 % of a 70B step). We read per-module states only at their
    pre/post forward/backward hooks, which it still records; the global peak stays exact.
    It also keeps the peak of activations + temporaries (``activation_peak_bytes``), which
    need not fall at the moment of the total's peak.
    """
    from torch.distributed._tools.mem_tracker import _TOTAL_KEY

    class Tracker(tracker_cls):
        #: largest activations + temporaries seen so far, and the snapshot at that moment
        activation_peak_bytes = 0
        activation_peak_snap: dict = {}

        def _update_peak_stats(self, peak_state) -> None:
            for dev, snap in self._curr_mem_snap.items():
                if self._peak_mem.get(dev, 0) < snap[_TOTAL_KEY]:
                    self._peak_mem[dev] = snap[_TOTAL_KEY]
                    self._peak_mem_snap[dev] = dict(snap)  # values are ints: a copy suffices
                act = sum(v for k, v in snap.items() if getattr(k, "value", k) in _ACTIVATION_KINDS)
                if act > self.activation_peak_bytes:
                    self.activation_peak_bytes = act
                    self.activation_peak_snap = {dev: dict(snap)}

    Tracker.__name__ = tracker_cls.__name__
    return Tracker
