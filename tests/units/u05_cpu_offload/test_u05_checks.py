"""Unit 05's graded checks: a correct answer passes, a wrong one fails with a ✗ line, one that
calls the course's own answer is refused."""

from __future__ import annotations

import pytest
import torch

from course_lib.measure import estimate
from course_lib.units.u05_cpu_offload import checks


# ---- task 1 ----------------------------------------------------------------------------------
def _predict(parts, overlap):
    if overlap:
        return max(
            parts["compute"],
            parts["to_host"] + parts["to_device"],
            parts["host_adam"],
            parts["store_read"] + parts["store_write"],
        )
    return sum(parts.values())


def test_task1_correct_wrong_refused(capsys):
    checks.check_step_time(_predict)
    assert capsys.readouterr().out.startswith("✓ task 1: serial prediction matches")
    with pytest.raises(AssertionError, match="✗ task 1: overlap=False: your prediction"):
        checks.check_step_time(lambda p, o: _predict(p, True) if not o else _predict(p, True))
    with pytest.raises(AssertionError, match="✗ task 1: overlap=True"):
        checks.check_step_time(lambda p, o: sum(p.values()))
    with pytest.raises(AssertionError, match="✗ task 1: uses the course's own offload_step_time"):
        checks.check_step_time(
            lambda p, o: estimate.offload_step_time(
                compute_s=p["compute"],
                transfer_s=p["to_host"] + p["to_device"],
                host_s=p["host_adam"],
                storage_s=p["store_read"] + p["store_write"],
                overlap=o,
            )
        )
    with pytest.raises(AssertionError, match="✗ task 1: .*expected a float"):
        checks.check_step_time(lambda p, o: "1 s")


# ---- task 2 ----------------------------------------------------------------------------------
_DEVICE_BYTES = {"none": 16, "optimizer": 4, "optimizer+grads": 2, "all": 0}


def _choose(n, budget, act):
    for level, b in _DEVICE_BYTES.items():
        if b * n + act <= budget:
            return level
    return None


def test_task2_correct_wrong_refused(capsys):
    checks.check_choose_offload(_choose)
    assert capsys.readouterr().out.startswith("✓ task 2")
    with pytest.raises(
        AssertionError,
        match=r"✗ task 2: choose_offload\(7e9 params, budget 40 GB.*'optimizer\+grads'",
    ):
        checks.check_choose_offload(lambda n, b, a: _choose(n, b - 1, a))  # strict < instead of <=
    with pytest.raises(AssertionError, match="✗ task 2: uses the course's own offload_split"):
        checks.check_choose_offload(
            lambda n, b, a: next(
                (
                    lv
                    for lv in estimate.OFFLOAD_LEVELS
                    if estimate.offload_split(n, level=lv)["device"] + a <= b
                ),
                None,
            )
        )
    with pytest.raises(AssertionError, match="✗ task 2: expected a level name"):
        checks.check_choose_offload(lambda n, b, a: 1)


# ---- task 3 ----------------------------------------------------------------------------------
class _Offload:
    def __init__(self, params, lr=1e-3, weight_decay=1e-2):
        self.params = list(params)
        self.master = [
            torch.nn.Parameter(p.detach().to("cpu", torch.float32, copy=True)) for p in self.params
        ]
        self.host_opt = torch.optim.AdamW(self.master, lr=lr, weight_decay=weight_decay)

    @torch.no_grad()
    def step(self):
        for p, m in zip(self.params, self.master):
            m.grad = p.grad.to("cpu", torch.float32)
        self.host_opt.step()
        for p, m in zip(self.params, self.master):
            p.copy_(m.to(p.dtype))


class _SyncsMasterFromDevice(_Offload):
    """The planted bug: the host copy is overwritten with the rounded device weights."""

    @torch.no_grad()
    def step(self):
        for p, m in zip(self.params, self.master):
            m.copy_(p)
            m.grad = p.grad.to("cpu", torch.float32)
        self.host_opt.step()
        for p, m in zip(self.params, self.master):
            p.copy_(m)


class _UsesTheCourse(_Offload):
    def __init__(self, params, lr=1e-3, weight_decay=1e-2):
        from course_lib.techniques.offload import OffloadAdamW

        super().__init__(params, lr=lr, weight_decay=weight_decay)
        self.inner = OffloadAdamW(self.params, lr=lr, weight_decay=weight_decay)

    def step(self):
        self.inner.step()


def test_task3_correct_wrong_refused(capsys):
    checks.check_offload_step(_Offload)
    assert capsys.readouterr().out.startswith("✓ task 3")
    with pytest.raises(AssertionError, match="✗ task 3: bfloat16 model: parameter 0 differs"):
        checks.check_offload_step(_SyncsMasterFromDevice)
    with pytest.raises(AssertionError, match="✗ task 3: uses the course's own OffloadAdamW"):
        checks.check_offload_step(_UsesTheCourse)
