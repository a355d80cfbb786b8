"""Optimizer offload: AdamW whose fp32 master weights and moments live off the device.

Introduced in notebooks/05_cpu_offload.ipynb.

:class:`OffloadAdamW` is ZeRO-Offload's host update (Ren et al. 2021, arXiv:2101.06840) in one
process, with the gradients kept on the device until the step (ZeRO-Offload streams them to the host
during backward): the device keeps the (16- or 32-bit) parameters and their gradients; the host keeps
an fp32 master copy of every parameter, its fp32 gradient and Adam's m and v, and runs the update.
Each step

1. ``offload_grads``: the gradients go down, in the parameters' dtype (2 bytes per parameter for
   bf16), into host staging buffers, and are widened to fp32 on the host;
2. ``host_step``: ``torch.optim.AdamW`` updates the fp32 master weights on the host (DeepSpeed
   uses its own vectorised ``DeepSpeedCPUAdam``; the update is the same);
3. ``load_params``: the updated weights are rounded to the parameters' dtype on the host and go
   up into the device parameters (in place: the model never sees new tensors).

``tier="file"`` puts the master weights, m and v in a file between steps, the NVMe tier of
ZeRO-Infinity (Rajbhandari et al. 2021, arXiv:2104.07857): ``host_step`` reads them, updates
and writes them back (``fsync``), and drops them from the page cache
(``posix_fadvise(POSIX_FADV_DONTNEED)``, Linux) so that the next read comes from the disk; the
host tensors hold no memory in between.

Parity: the same parameters as ``torch.optim.AdamW`` on an fp32 model, and as the master-weights
recipe of unit 04 (``techniques.optim.MasterWeights``) on a bf16 model -- bit for bit on a CPU,
where both run the same single-tensor AdamW on the same numbers (tests/techniques/test_offload.py).

Every phase is timed (``last_times``, seconds, CUDA-synchronized) and its bytes counted
(``bytes_moved``), so a notebook can put the measured parts beside ``estimate.offload_step_time``.
"""

from __future__ import annotations

import io
import os
import tempfile
import time
import weakref
from typing import Any, Iterable, Sequence

import torch

from course_lib import validate
from course_lib.runtime.device import sync

__all__ = ["OffloadAdamW", "TIERS", "PHASES", "drop_page_cache", "page_cache_control"]

#: where the host keeps master weights and moments between steps
TIERS = ("memory", "file")
#: the timed phases of a step, in order (``compute`` is the caller's forward + backward)
PHASES = ("to_host", "store_read", "host_adam", "store_write", "to_device")


def page_cache_control() -> bool:
    """True where the page cache of a file can be dropped (``os.posix_fadvise``: Linux and some
    other Unix systems; not macOS or Windows)."""
    return hasattr(os, "posix_fadvise") and hasattr(os, "POSIX_FADV_DONTNEED")


def drop_page_cache(fd: int) -> bool:
    """Ask the kernel to drop the cached pages of the open file ``fd`` (written pages must be
    flushed first: ``os.fsync``). Returns False where ``posix_fadvise`` does not exist, so the
    caller can say that its reads may come from memory."""
    if not page_cache_control():
        return False
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    return True


def _remove_file(f, path: str) -> None:
    f.close()
    try:
        os.remove(path)
    except OSError:
        pass


class OffloadAdamW:
    """AdamW with the fp32 master weights, fp32 gradients and Adam state on the host.

    Args:
        params: the model's parameters (on the device; fp32, bf16 or fp16).
        lr, betas, eps, weight_decay: as ``torch.optim.AdamW``.
        tier: ``"memory"`` (host RAM) or ``"file"`` (a file between steps, see the module docstring).
        directory: where the file of ``tier="file"`` goes (default: the system's temporary
            directory); it is deleted by :meth:`close` or when the optimizer is collected.
        pin_memory: page-locked host staging buffers (default: True when the parameters are on a
            CUDA device). Pinned memory lets the copy engine DMA directly; pageable memory goes
            through a driver bounce buffer.
    """

    def __init__(
        self,
        params: Iterable[torch.nn.Parameter],
        *,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        tier: str = "memory",
        directory: str | None = None,
        pin_memory: bool | None = None,
    ) -> None:
        self.params = [p for p in params if p.requires_grad]
        if not self.params:
            raise ValueError("params is empty: expected at least one parameter that requires grad")
        bad = sorted({str(p.dtype) for p in self.params if not p.dtype.is_floating_point})
        if bad:
            raise ValueError(f"params = parameters of dtype {bad}: expected floating-point ones")
        self.tier = validate.choice("tier", tier, TIERS)
        self.device = self.params[0].device
        if pin_memory is None:
            pin_memory = self.device.type == "cuda"
        self.pin_memory = bool(pin_memory) and torch.cuda.is_available()
        # host side: fp32 master weights (with fp32 .grad buffers) and, for 16-bit parameters,
        # staging buffers in the parameters' dtype: what crosses the link is 2 bytes per parameter
        self.master = [
            torch.nn.Parameter(p.detach().to("cpu", torch.float32, copy=True)) for p in self.params
        ]
        for m in self.master:
            m.grad = torch.zeros_like(m)
        self.staging = [
            None
            if p.dtype == torch.float32 and self.device.type == "cpu"
            else torch.empty(p.shape, dtype=p.dtype, pin_memory=self.pin_memory)
            for p in self.params
        ]
        self.inner = torch.optim.AdamW(
            self.master, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, foreach=False
        )
        self.last_times: dict[str, float] = dict.fromkeys(PHASES, 0.0)
        self.bytes_moved: dict[str, int] = dict.fromkeys(PHASES, 0)
        self._file: io.FileIO | None = None
        self._shapes: dict[int, torch.Size] = {}  # shapes of the tensors now on disk
        self.cache_dropped = False
        if self.tier == "file":
            fd, self.path = tempfile.mkstemp(prefix="offload-", suffix=".bin", dir=directory)
            self._file = os.fdopen(fd, "r+b", buffering=0)
            # delete the file when the optimizer is collected (a finalizer, not __del__: it runs
            # even at interpreter exit and never resurrects the object)
            self._finalizer = weakref.finalize(self, _remove_file, self._file, self.path)

    # ---- the three phases of a step --------------------------------------------------------
    def offload_grads(self) -> None:
        """Device -> host: each gradient into its host buffer (fp32 on the host)."""
        with torch.no_grad():  # a context, not the decorator: see the note in step()
            self._offload_grads()

    def _offload_grads(self) -> None:
        t0 = self._start()
        moved = 0
        for p, m, s in zip(self.params, self.master, self.staging):
            host_grad = _allocated_grad(m)
            if p.grad is None:
                host_grad.zero_()
                continue
            if s is None:  # fp32 on a CPU: the host buffer is the destination
                host_grad.copy_(p.grad)
            else:
                s.copy_(p.grad, non_blocking=self.pin_memory)  # (shape of p) in p.dtype
                sync(self.device)  # the copy must land before the host reads it
                host_grad.copy_(s)  # widen to fp32 on the host
            moved += p.grad.numel() * p.grad.element_size()
        self._stop("to_host", t0, moved)

    def host_step(self) -> None:
        """The AdamW update on the host (with ``tier="file"``: read state, update, write back)."""
        with torch.no_grad():  # a context, not the decorator: see the note in step()
            self._host_step()

    def _host_step(self) -> None:
        if self.tier == "file" and self.inner.state:
            t0 = time.perf_counter()
            self.bytes_moved["store_read"] = self._read_state()
            self.last_times["store_read"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        self.inner.step()
        self.last_times["host_adam"] = time.perf_counter() - t0
        self.bytes_moved["host_adam"] = 0
        if self.tier == "file":
            t0 = time.perf_counter()
            self.bytes_moved["store_write"] = self._write_state()
            self.last_times["store_write"] = time.perf_counter() - t0

    def load_params(self) -> None:
        """Host -> device: the updated weights, rounded to the parameters' dtype on the host."""
        with torch.no_grad():  # a context, not the decorator: see the note in step()
            self._load_params()

    def _load_params(self) -> None:
        t0 = self._start()
        moved = 0
        for p, m, s in zip(self.params, self.master, self.staging):
            if s is None:
                p.copy_(m)
            else:
                s.copy_(m)  # round to p.dtype on the host
                p.copy_(s, non_blocking=self.pin_memory)  # then up
            moved += p.numel() * p.element_size()
        if self.tier == "file":
            self._release(self.master)
        self._stop("to_device", t0, moved)

    def step(self) -> None:
        """One synchronous step: offload_grads, host_step, load_params.

        (The phases enter ``torch.no_grad()`` as a context rather than through the decorator:
        the decorator's wrapper code is shared by every decorated function, so a check that
        keeps this class out of a learner's reach would see the learner's own decorated
        ``step`` as this one.)"""
        for k in PHASES:
            self.last_times[k] = 0.0
            self.bytes_moved[k] = 0
        self.offload_grads()
        self.host_step()
        self.load_params()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    # ---- what lives on the host ----------------------------------------------------------------
    def host_bytes(self) -> dict[str, int]:
        """Bytes of host state: ``master`` (fp32 weights), ``grads`` (fp32), ``optimizer`` (m, v
        and the step counters), ``staging`` (buffers in the parameters' dtype), ``total``, and
        ``on_disk``: the part of it that sits in the file now (``tier="file"``, between steps)."""

        def nbytes(t):
            return self._shapes.get(id(t), t.shape).numel() * t.element_size()

        out = {
            "master": sum(nbytes(m) for m in self.master),
            "grads": sum(nbytes(m.grad) for m in self.master),
            "optimizer": sum(
                nbytes(t)
                for st in self.inner.state.values()
                for t in st.values()
                if isinstance(t, torch.Tensor)
            ),
            "staging": sum(nbytes(s) for s in self.staging if s is not None),
        }
        out["total"] = sum(out.values())
        out["on_disk"] = sum(self._shapes[k].numel() * 4 for k in self._shapes)  # fp32 tensors
        return out

    # ---- the file tier ---------------------------------------------------------------------
    def _stored(self) -> list[torch.Tensor]:
        """Tensors kept in the file, in file order: per parameter its master, m and v."""
        out = []
        for m in self.master:
            st = self.inner.state[m]
            out += [m, st["exp_avg"], st["exp_avg_sq"]]
        return out

    def _state_file(self) -> io.FileIO:
        if self._file is None:
            raise RuntimeError("the file tier's state file is closed (or tier is not 'file')")
        return self._file

    def _write_state(self) -> int:
        tensors = self._stored()
        self._shapes.clear()
        file = self._state_file()
        file.seek(0)
        n = 0
        for t in tensors:
            n += file.write(t.detach().numpy().data.cast("B"))  # (numel,) fp32 bytes
        os.fsync(file.fileno())  # on the disk, so that dropping the cache loses nothing
        self.cache_dropped = drop_page_cache(file.fileno())
        # m and v leave memory now; the masters after load_params has sent them up
        self._release([t for t in tensors if not isinstance(t, torch.nn.Parameter)])
        return n

    def _release(self, tensors: Sequence[torch.Tensor]) -> None:
        # free the memory until the next read; the tensor objects (the Parameter the optimizer
        # knows, the entries of its state) stay, with an empty payload in between
        for t in tensors:
            self._shapes[id(t)] = t.shape
            t.data = torch.empty(0, dtype=t.dtype)

    def _read_into(self, tensors: list[torch.Tensor], offsets: list[int]) -> int:
        n = 0
        for t, off in zip(tensors, offsets):
            buf = torch.empty(self._shapes.get(id(t), t.shape), dtype=t.dtype)
            file = self._state_file()
            file.seek(off)
            n += file.readinto(buf.numpy().data.cast("B"))  # (numel,) fp32 bytes
            t.data = buf
            self._shapes.pop(id(t), None)
        return n

    def _offsets(self) -> list[int]:
        offs, pos = [], 0
        for t in self._stored():
            offs.append(pos)
            pos += self._shapes.get(id(t), t.shape).numel() * t.element_size()
        return offs

    def _read_state(self) -> int:
        """Read master, m and v back from the file (the page cache was dropped after the write,
        so this reads the disk)."""
        return self._read_into(self._stored(), self._offsets())

    # ---- timing ----------------------------------------------------------------------------
    def _start(self) -> float:
        sync(self.device)
        return time.perf_counter()

    def _stop(self, phase: str, t0: float, nbytes: int) -> None:
        sync(self.device)
        self.last_times[phase] = time.perf_counter() - t0
        self.bytes_moved[phase] = nbytes

    def close(self) -> None:
        """Delete the file of ``tier="file"`` (idempotent)."""
        if self._file is not None:
            self._finalizer()
            self._file = None

    def __repr__(self) -> str:
        n = sum(m.numel() for m in self.master)
        return (
            f"OffloadAdamW({n:,} parameters on {self.device}, state in host "
            f"{'RAM' if self.tier == 'memory' else 'file ' + self.path})"
        )

    def state_dict(self) -> dict[str, Any]:
        return self.inner.state_dict()


def _allocated_grad(master: torch.Tensor) -> torch.Tensor:
    """The host gradient buffer of a master weight (allocated once, when the optimizer is made)."""
    if master.grad is None:
        raise RuntimeError("a master weight lost its host gradient buffer")
    return master.grad
