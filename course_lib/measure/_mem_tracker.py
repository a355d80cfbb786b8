"""The MemTracker adapter behind :class:`course_lib.measure.memory.MemoryMeter` (read that docstring).

With memory.py, the only place in the course that imports PyTorch's private memory-tracking API
(``torch.distributed._tools``); tests/measure/test_memory.py pins the behaviour we rely on.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

# the one place in the course that imports the private API
from torch.distributed._tools.common_utils import get_untyped_storages
from torch.distributed._tools.mem_tracker import _TOTAL_KEY, MemTracker, _MemRefType
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)

# MemTracker reference type -> our category
_CATEGORY_OF = {
    _MemRefType.PARAM: "params",
    _MemRefType.BUFFER: "params",
    _MemRefType.GRAD: "grads",
    _MemRefType.OPT: "optimizer",
    _MemRefType.ACT: "activations",
    _MemRefType.TEMP: "temporaries",
    _MemRefType.OTH: "other",
}


def _empty() -> dict[str, int]:
    # memory.CATEGORIES in its order (the meter passes it in, checked there: this module
    # never imports memory, which imports it)
    return dict.fromkeys(_CATEGORY_OF.values(), 0)


class _NoHandle:
    """Stands for a hook handle that was never registered (see ``_Tracker``)."""

    def remove(self) -> None:
        pass


class _Tracker(MemTracker):
    """MemTracker plus a chronological timeline, per-device peaks with our categories, and the
    optimizer-transient correction. Everything that depends on MemTracker internals is here."""

    def __init__(self, device: str, categories: tuple[str, ...]) -> None:
        super().__init__()
        if tuple(_empty()) != categories:
            raise RuntimeError(f"categories {categories} != the tracker's {tuple(_empty())}")
        self._device = device
        self._n_ops = 0
        self._step_created: dict[int, list[Any]] = {}  # id(winfo) -> [winfo, born op, freed op]
        self._step_start: list[int] = []  # op count when each running step began
        self._our_opt_handles: tuple[Any, ...] = ()
        self.peaks: dict[
            str, tuple[int, dict[str, int], int, str]
        ] = {}  # dev -> (total, bd, op, phase)
        self.rows: list[dict[str, Any]] = []

    # ---- categories -----------------------------------------------------------------------
    def breakdown(self, device: str) -> dict[str, int]:
        """Current bytes per category on ``device`` (MemTracker's labels, mapped)."""
        out = _empty()
        for dev, snap in self._curr_mem_snap.items():
            if str(dev) != device:
                continue
            for reftype, cat in _CATEGORY_OF.items():
                out[cat] += snap.get(reftype, 0)
        return out

    # ---- frozen parameters ----------------------------------------------------------------
    # MemTracker registers a gradient hook on every parameter it meets, which torch refuses for a
    # parameter that does not require grad (a frozen base under LoRA, a 4-bit weight). Such a
    # parameter never gets a gradient: a no-op handle pair makes MemTracker skip the hook.
    def _track_module_params_and_buffers(
        self, module: nn.Module, install_grad_hooks: bool = True
    ) -> tuple[int, int]:
        if install_grad_hooks:
            for p in module.parameters():
                if not p.requires_grad and self._param_to_grad_hook_handles.get(p) is None:
                    self._param_to_grad_hook_handles[p] = (_NoHandle(), _NoHandle())
        return super()._track_module_params_and_buffers(module, install_grad_hooks)

    # ---- optimizer transients -------------------------------------------------------------
    # While a step runs MemTracker labels every new tensor OPT. We note when each of them is
    # created and freed (in op counts); when the step ends we know which ones are optimizer
    # state (in ``optimizer.state``) and move the others, alive at a peak inside the step, from
    # *optimizer* to *temporaries*. One pass per step, so a 7B AdamW step stays fast.
    def _track(self, reftype: Any, t: torch.Tensor) -> None:
        if not self._in_opt:
            return super()._track(reftype, t)
        new = [st for st in get_untyped_storages(t) if st not in self._WINFO]
        super()._track(reftype, t)
        for st in new:  # storages this operator created (in-place results are not new)
            winfo, _ = self._WINFO.get(st, (None, None))
            if winfo is not None:
                self._step_created[id(winfo)] = [winfo, self._n_ops + 1, None]

    def _delete_callback(self, winfo: Any, w_st: Any) -> None:
        super()._delete_callback(winfo, w_st)
        entry = self._step_created.get(id(winfo))
        if entry is not None and entry[2] is None:
            entry[2] = self._n_ops + 1  # alive up to and including op _n_ops

    def _state_winfo_ids(self, optimizer: torch.optim.Optimizer) -> set[int]:
        ids = set()
        for state in optimizer.state.values():
            for val in state.values():
                if isinstance(val, torch.Tensor):
                    for st in get_untyped_storages(val):
                        winfo, _ = self._WINFO.get(st, (None, None))
                        if winfo is not None:
                            ids.add(id(winfo))
        return ids

    def _settle_step(self, optimizer: torch.optim.Optimizer, step_start_op: int) -> None:
        state_ids = self._state_winfo_ids(optimizer)
        for dev, (total, bd, op, phase) in list(self.peaks.items()):
            if op <= step_start_op:
                continue  # this device's peak is not inside this step
            transient = sum(
                w.mem_consumed
                for w, born, died in self._step_created.values()
                if id(w) not in state_ids
                and str(w.device) == dev
                and born <= op
                and (died is None or died > op)
            )
            transient = min(transient, bd["optimizer"])
            bd = {
                **bd,
                "optimizer": bd["optimizer"] - transient,
                "temporaries": bd["temporaries"] + transient,
            }
            self.peaks[dev] = (total, bd, op, phase)
        self._step_created.clear()

    def phase(self) -> str:
        if self._in_opt:
            return "step"
        return "backward" if self._mod_tracker.is_bw else "forward"

    # ---- timeline -------------------------------------------------------------------------
    def record(self, event: str, module: str = "", phase: str | None = None) -> None:
        bd = self.breakdown(self._device)
        row = {"op": self._n_ops, "event": event, "module": module, "phase": phase or self.phase()}
        row.update(bd)
        row["total"] = sum(bd.values())
        self.rows.append(row)

    def _name(self, module: nn.Module) -> str:
        return self._mod_tracker.get_known_fqn(module) or type(module).__name__

    def _pre_fw_hook(self, module: nn.Module, inputs: Any) -> None:
        if (
            module in self.memory_tracking
            and not self._mod_tracker.is_bw
            and set(self._mod_tracker.parents) - {self._name(module)} == {"Global"}
        ):
            # the root module runs again (next step or micro-batch): MemTracker refuses; its
            # per-module statistics are not what we report, so restart them for this module
            del self.memory_tracking[module]
        super()._pre_fw_hook(module, inputs)
        # a forward inside backward is activation-checkpointing recomputation
        self.record(
            "pre_recompute" if self._mod_tracker.is_bw else "pre_forward", self._name(module)
        )

    def _post_fw_hook(self, module: nn.Module, inputs: Any, outputs: Any) -> None:
        if module in self.memory_tracking:
            super()._post_fw_hook(module, inputs, outputs)
        self.record(
            "post_recompute" if self._mod_tracker.is_bw else "post_forward", self._name(module)
        )

    def _pre_bw_hook(self, module: nn.Module, args: Any) -> None:
        if module is None or module not in self.memory_tracking:
            return
        super()._pre_bw_hook(module, args)
        self.record("pre_backward", self._name(module), "backward")

    def _post_bw_hook(self, module: nn.Module, args: Any) -> None:
        if module is None or module not in self.memory_tracking:
            return
        super()._post_bw_hook(module, args)
        self.record("post_backward", self._name(module), "backward")

    def _register_global_optimizer_hook(self) -> None:
        super()._register_global_optimizer_hook()  # sets/unsets _in_opt, labels state OPT

        def pre(
            optimizer: torch.optim.Optimizer, args: tuple[Any, ...], kwargs: dict[str, Any]
        ) -> None:
            self._step_start.append(self._n_ops)
            self.record("pre_step", type(optimizer).__name__, "step")

        def post(
            optimizer: torch.optim.Optimizer, args: tuple[Any, ...], kwargs: dict[str, Any]
        ) -> None:
            self._settle_step(optimizer, self._step_start.pop())
            self.record("post_step", type(optimizer).__name__, "step")

        # registered after MemTracker's: its post hook (state -> OPT) runs before ours
        self._our_opt_handles = (
            register_optimizer_step_pre_hook(pre),
            register_optimizer_step_post_hook(post),
        )

    def _deregister_param_and_optimizer_hooks(self) -> None:
        super()._deregister_param_and_optimizer_hooks()
        for handle in self._our_opt_handles:
            handle.remove()
        self._our_opt_handles = ()

    # ---- peaks ----------------------------------------------------------------------------
    def _update_peak_stats(self, peak_state: Any) -> None:
        # Replaces MemTracker's version, which also refreshes a peak snapshot of every active
        # module by scanning all modules after every operator (quadratic: minutes for a 7B
        # model). We keep the global per-device peak only; per-module peaks are not reported.
        self._n_ops += 1
        for dev, snap in self._curr_mem_snap.items():
            total = snap.get(_TOTAL_KEY, 0)
            if total > self._peak_mem.get(dev, 0):
                self._peak_mem[dev] = total
                self._peak_mem_snap[dev] = dict(snap)
            name = str(dev)
            if total > self.peaks.get(name, (-1,))[0]:
                self.peaks[name] = (total, self.breakdown(name), self._n_ops, self.phase())
