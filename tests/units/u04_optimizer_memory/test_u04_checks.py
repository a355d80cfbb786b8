"""Unit 04's graded checks accept the reference and name each bug, under two grading seeds; a
table of the default seed's answers fails under another."""

from __future__ import annotations

import pytest
import torch
from _grading_seeds import copied_fails, seed_fixture  # noqa: F401 (the seed fixture)
from _rewritten import rewritten

# the course's Adam as a learner would have written it: same code, compiled anew (the checks
# refuse the course's own class)
O = rewritten("course_lib.techniques.optim")  # noqa: E741 - the name the tests below use


# --- the exercise checks of unit 04 (course_lib.units.u04_optimizer_memory.checks) built on this reference --------
class _NoBiasCorrection(O.Adam):
    """A plausible bug: Adam without bias correction."""

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                st = self.state[p]
                if not st:
                    st["m"], st["v"] = torch.zeros_like(p), torch.zeros_like(p)
                st["m"].mul_(0.9).add_(p.grad, alpha=0.1)
                st["v"].mul_(0.999).addcmul_(p.grad, p.grad, value=0.001)
                p.sub_(group["lr"] * st["m"] / (st["v"].sqrt() + group["eps"]))


class _Fp32State(O.Adam):
    """A plausible bug: state always in fp32 (wrong bytes for bf16 parameters)."""

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                self.state[p]["m"] = torch.zeros(p.shape)
                self.state[p]["v"] = torch.zeros(p.shape)


class _CoupledOnly(O.Adam):
    """A plausible bug: AdamW's weight decay added to the gradient (Adam's L2) instead."""

    def __init__(self, params, decoupled=False, **kw):
        super().__init__(params, decoupled=False, **kw)


def test_unit04_checks_pass_on_the_reference(capsys, seed):
    from course_lib.units.u04_optimizer_memory import checks as unit04

    unit04.check_adam(O.Adam)
    unit04.check_adamw(O.Adam)
    unit04.check_adam_state_bytes(O.Adam)
    lines = capsys.readouterr().out.splitlines()
    assert [ln[:8] for ln in lines] == ["✓ task 1", "✓ task 2", "✓ task 3"]


def test_unit04_checks_catch_bugs(seed):
    from course_lib.units.u04_optimizer_memory import checks as unit04

    with pytest.raises(
        AssertionError, match=r"✗ task 1: Adam\(lr=.*, weight_decay=0\): parameter 0"
    ):
        unit04.check_adam(_NoBiasCorrection)
    with pytest.raises(AssertionError, match=r"✗ task 2: AdamW"):
        unit04.check_adamw(_CoupledOnly)
    with pytest.raises(
        AssertionError, match=r"✗ task 3: torch.bfloat16 parameters .* is not m and v at 2 bytes"
    ):
        unit04.check_adam_state_bytes(_Fp32State)


# --- tasks 4-6: predict the step's peak, find the bug in a master copy, ZeRO-1 at 7B and 70B --------
def _sizes(widths):
    return [n for a, b in zip(widths[:-1], widths[1:]) for n in (a * b, b)]


def _peak(widths):
    """16 B/param at rest + the fp32 gradients (4) + two scratch tensors of the largest parameter."""
    sizes = _sizes(widths)
    return 20 * sum(sizes) + 2 * 4 * max(sizes)


class _Master:
    """The master-weights recipe written out, as a learner would (optionally with task 5's bug)."""

    overwrite_master = False

    def __init__(self, model, lr):
        self.params = list(model.parameters())
        self.master = [p.detach().float().clone() for p in self.params]
        self.optimizer = torch.optim.Adam(self.master, lr=lr)

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self):
        for p, m in zip(self.params, self.master):
            m.grad = p.grad.float()
        self.optimizer.step()
        for p, m in zip(self.params, self.master):
            p.copy_(m)
            if self.overwrite_master:
                m.copy_(p)  # the bug of task 5: the master is rounded to bf16 every step
            m.grad = None


class _Overwrites(_Master):
    overwrite_master = True


class _NeverCopiesBack(_Master):
    @torch.no_grad()
    def step(self):
        for p, m in zip(self.params, self.master):
            m.grad = p.grad.float()
        self.optimizer.step()


def _zero1(n, world, master):
    return 4 * n + (12 if master else 8) * n // world


def test_unit04_new_tasks_pass_on_right_answers(capsys, seed):
    from course_lib.units.u04_optimizer_memory import checks as unit04

    unit04.check_predict_step_peak(_peak)
    unit04.check_master_bug(_Master)
    unit04.check_zero1_at_scale(_zero1)
    lines = capsys.readouterr().out.splitlines()
    assert [ln[:8] for ln in lines] == ["✓ task 4", "✓ task 5", "✓ task 6"]


def test_unit04_new_tasks_fail_wrong_answers(seed):
    from course_lib.units.u04_optimizer_memory import checks as unit04

    # at rest only (no fp32 gradients, no scratch); one scratch tensor instead of two; a float
    with pytest.raises(AssertionError, match=r"✗ task 4: widths \[[\d, ]+\].*16.00 B/param"):
        unit04.check_predict_step_peak(lambda w: 16 * sum(_sizes(w)))
    with pytest.raises(AssertionError, match=r"✗ task 4: widths"):
        unit04.check_predict_step_peak(lambda w: 20 * sum(_sizes(w)) + 4 * max(_sizes(w)))
    with pytest.raises(AssertionError, match=r"✗ task 4: .* must be an int, got float"):
        unit04.check_predict_step_peak(lambda w: float(_peak(w)))
    with pytest.raises(AssertionError, match=r"✗ task 5: every master value is a bf16 number"):
        unit04.check_master_bug(_Overwrites)
    with pytest.raises(AssertionError, match=r"✗ task 5: .* bf16 weights never changed"):
        unit04.check_master_bug(_NeverCopiesBack)
    # the master copy counted as unsharded weights rather than optimizer state (K = 8 for both)
    with pytest.raises(AssertionError, match=r"✗ task 6: 7B .* 16-byte .* over 8 GPU"):
        unit04.check_zero1_at_scale(lambda n, w, m: (8 if m else 4) * n + 8 * n // w)


def test_unit04_new_tasks_refuse_the_course_answers(seed):
    from course_lib.measure import estimate
    from course_lib.measure.memory import MemoryMeter  # noqa: F401 - the peak task's measuring tool
    from course_lib.techniques import optim
    from course_lib.units.u04_optimizer_memory import checks as unit04

    def peak_from_estimate(widths):
        n = sum(_sizes(widths))
        return (
            estimate.model_state_bytes(n, precision="bf16-mixed")["total"]
            + 4 * n
            + 8 * max(_sizes(widths))
        )

    with pytest.raises(AssertionError, match=r"✗ task 4: uses the course's own model_state_bytes"):
        unit04.check_predict_step_peak(peak_from_estimate)
    with pytest.raises(AssertionError, match=r"✗ task 5: uses the course's own MasterWeights"):
        unit04.check_master_bug(lambda model, lr: optim.MasterWeights(model, "adam", lr=lr))
    with pytest.raises(
        AssertionError, match=r"✗ task 6: uses the course's own zero_bytes_per_rank"
    ):
        unit04.check_zero1_at_scale(
            lambda n, w, m: estimate.zero_bytes_per_rank(n, stage=1, world_size=w, k=12 if m else 8)
        )


def test_copied_answers_fail_under_another_seed(monkeypatch):
    from course_lib.units.u04_optimizer_memory import checks as unit04

    copied_fails(monkeypatch, unit04.check_predict_step_peak, _peak, task=4)
    copied_fails(monkeypatch, unit04.check_zero1_at_scale, _zero1, task=6)
