"""Unit 04's graded checks accept the reference and name each bug."""
from __future__ import annotations

import pytest
import torch

from course_lib.grading.references import rewritten

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


def test_unit04_checks_pass_on_the_reference(capsys):
    from course_lib.units.u04_optimizer_memory import checks as unit04

    unit04.check_adam(O.Adam)
    unit04.check_adamw(O.Adam)
    unit04.check_adam_state_bytes(O.Adam)
    lines = capsys.readouterr().out.splitlines()
    assert [ln[:8] for ln in lines] == ["✓ task 1", "✓ task 2", "✓ task 3"]


def test_unit04_checks_catch_bugs():
    from course_lib.units.u04_optimizer_memory import checks as unit04

    with pytest.raises(AssertionError, match=r"✗ task 1: Adam\(lr=1e-2, weight_decay=0\): parameter 0"):
        unit04.check_adam(_NoBiasCorrection)
    with pytest.raises(AssertionError, match=r"✗ task 2: AdamW"):
        unit04.check_adamw(_CoupledOnly)
    with pytest.raises(AssertionError, match=r"✗ task 3: torch.bfloat16 parameters .* expected 848 bytes"):
        unit04.check_adam_state_bytes(_Fp32State)
