"""Unit 03's graded checks accept the reference and name each bug."""
from __future__ import annotations

import pytest

from course_lib.grading.references import rewritten

# the course's scaler as a learner would have written it: same code, compiled anew (the checks
# refuse the course's own class)
P = rewritten("course_lib.techniques.precision")


# --- the exercise checks of unit 03 (course_lib.units.u03_mixed_precision.checks) built on this reference --------
class _NoBackoff(P.DynamicLossScaler):
    """A plausible bug: never backs off (keeps the scale after an overflow)."""

    def update(self, found_inf):
        return super().update(False)


class _DividesTwice(P.DynamicLossScaler):
    """A plausible bug: unscales twice."""

    def unscale_(self, params):
        params = list(params)
        super().unscale_(params)
        return super().unscale_(params)


def _kw(cls):
    return lambda **kw: cls(**kw)


def test_unit03_checks_pass_on_the_reference(capsys):
    from course_lib.units.u03_mixed_precision import checks as unit03

    unit03.check_underflow_recovery(_kw(P.DynamicLossScaler))
    unit03.check_scale_schedule(_kw(P.DynamicLossScaler))
    unit03.check_fp16_training(_kw(P.DynamicLossScaler))
    lines = capsys.readouterr().out.splitlines()
    assert [ln[:8] for ln in lines] == ["✓ task 1", "✓ task 2", "✓ task 3"]


def test_unit03_checks_catch_bugs():
    from course_lib.units.u03_mixed_precision import checks as unit03

    with pytest.raises(AssertionError, match=r"✗ task 1: grad of 0.weight: .*divide by the scale exactly once"):
        unit03.check_underflow_recovery(_kw(_DividesTwice))
    with pytest.raises(AssertionError, match=r"✗ task 2: step 4 \(an overflow"):
        unit03.check_scale_schedule(_kw(_NoBackoff))
    with pytest.raises(AssertionError, match=r"✗ task 3: (skipped steps|final scale)"):
        unit03.check_fp16_training(_kw(_NoBackoff))
