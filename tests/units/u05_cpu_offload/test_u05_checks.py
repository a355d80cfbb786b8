"""Unit 05's graded checks: a correct answer passes, a wrong one fails with a ✗ line, one that
calls the course's own answer is refused, under two grading seeds; a table of the default
seed's answers fails under another."""

from __future__ import annotations

import pytest
import torch
from _grading_seeds import copied_fails, seed_fixture  # noqa: F401 (the seed fixture)

from course_lib.measure import estimate
from course_lib.units.u05_cpu_offload import checks


# ---- task 1 ----------------------------------------------------------------------------------
def _predict(parts, overlap, k=1):
    device, link = k * parts["compute"], k * parts["to_host"] + parts["to_device"]
    disk = parts["store_read"] + parts["store_write"]
    if overlap:
        return max(device, link, parts["host_adam"], disk)
    return device + link + parts["host_adam"] + disk


def _lecture_only(parts, overlap, k=1):
    """The lecture's one-micro-batch model, applied as printed: right for k = 1 only."""
    return _predict(parts, overlap, 1)


def _compute_only_scaled(parts, overlap, k=1):
    """Scales the compute with the micro-batches but sends the gradients once per step."""
    return _predict({**parts, "to_host": parts["to_host"] / k}, overlap, k)


@pytest.fixture(scope="module")
def measured_steps():
    """The check's measured steps, taken once for this module (they take seconds)."""
    import dataclasses

    from course_lib.units.u05_cpu_offload.run import CONFIG, step_breakdown

    return step_breakdown(
        tier="file", steps=7, config=dataclasses.replace(CONFIG, n_layer=1), batch=2
    )


def test_task1_correct_wrong_refused(capsys, seed, monkeypatch, measured_steps):
    from course_lib.units.u05_cpu_offload import run

    monkeypatch.setattr(run, "step_breakdown", lambda **kw: measured_steps)
    checks.check_step_time(_predict)
    assert capsys.readouterr().out.strip() == (
        "✓ task 1: serial prediction matches the measured offloaded steps (median ratio within "
        "1 +- 0.1); with gradients sent every micro-batch, serial and overlapped match on 4 "
        "unseen steps"
    )
    with pytest.raises(AssertionError, match="✗ task 1: overlap=False: your prediction"):
        checks.check_step_time(lambda p, o, k: _predict(p, True, k))
    with pytest.raises(AssertionError, match="✗ task 1: one micro-batch, overlap=True"):
        checks.check_step_time(lambda p, o, k: _predict(p, False, k))
    with pytest.raises(AssertionError, match=r"✗ task 1: \d+ micro-batches, overlap=False"):
        checks.check_step_time(_lecture_only)
    with pytest.raises(AssertionError, match=r"✗ task 1: \d+ micro-batches, overlap="):
        checks.check_step_time(_compute_only_scaled)
    with pytest.raises(AssertionError, match="✗ task 1: uses the course's own offload_step_time"):
        checks.check_step_time(
            lambda p, o, k: estimate.offload_step_time(
                compute_s=k * p["compute"],
                transfer_s=k * p["to_host"] + p["to_device"],
                host_s=p["host_adam"],
                storage_s=p["store_read"] + p["store_write"],
                overlap=o,
            )
        )
    with pytest.raises(AssertionError, match="✗ task 1: .*expected a float"):
        checks.check_step_time(lambda p, o, k: "1 s")


# ---- task 2 ----------------------------------------------------------------------------------
_DEVICE_BYTES = {"none": 16, "optimizer": 4, "optimizer+grads": 2, "all": 0}


def _choose(n, budget, act):
    for level, b in _DEVICE_BYTES.items():
        if b * n + act <= budget:
            return level
    return None


def test_task2_correct_wrong_refused(capsys, seed):
    checks.check_choose_offload(_choose)
    assert (
        capsys.readouterr().out.strip() == "✓ task 2: the least offload that fits, in all 6 cases"
    )
    with pytest.raises(
        AssertionError,
        match=r"✗ task 2: choose_offload\(.*params, budget .*: '(optimizer\+grads|all)' is not",
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


def test_task3_correct_wrong_refused(capsys, seed):
    checks.check_offload_step(_Offload)
    assert capsys.readouterr().out.startswith("✓ task 3")
    with pytest.raises(AssertionError, match="✗ task 3: bfloat16 model: parameter 0 differs"):
        checks.check_offload_step(_SyncsMasterFromDevice)
    with pytest.raises(AssertionError, match="✗ task 3: uses the course's own OffloadAdamW"):
        checks.check_offload_step(_UsesTheCourse)


def test_copied_answers_fail_under_another_seed(monkeypatch, measured_steps):
    from course_lib.units.u05_cpu_offload import run

    monkeypatch.setattr(run, "step_breakdown", lambda **kw: measured_steps)
    copied_fails(monkeypatch, checks.check_choose_offload, _choose, task=2)
    # task 1: the measured steps answered right, the drawn ones from seed 0's table
    monkeypatch.setenv("COURSE_GRADE_SEED", "0")
    table = {
        (k, tuple(p.values())): (_predict(p, False, k), _predict(p, True, k))
        for p, k in checks._drawn_steps(1)
    }

    def copied(parts, overlap, k):
        if k == 1:
            return _predict(parts, overlap)
        return table.get((k, tuple(parts.values())), (1.0, 1.0))[overlap]

    checks.check_step_time(copied)
    monkeypatch.setenv("COURSE_GRADE_SEED", "7")
    with pytest.raises(AssertionError, match="✗ task 1: "):
        checks.check_step_time(copied)
