"""Unit 03's graded checks accept the reference and name each bug, under two grading seeds; a
table of the default seed's answers fails under another."""

from __future__ import annotations

import pytest
from _grading_seeds import copied_fails, seed_fixture  # noqa: F401 (the seed fixture)
from _rewritten import rewritten

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


def test_unit03_checks_pass_on_the_reference(capsys, seed):
    from course_lib.units.u03_mixed_precision import checks as unit03

    unit03.check_underflow_recovery(_kw(P.DynamicLossScaler))
    unit03.check_scale_schedule(_kw(P.DynamicLossScaler))
    unit03.check_fp16_training(_kw(P.DynamicLossScaler))
    lines = capsys.readouterr().out.splitlines()
    assert [ln[:8] for ln in lines] == ["✓ task 1", "✓ task 2", "✓ task 3"]


def test_unit03_checks_catch_bugs(seed):
    from course_lib.units.u03_mixed_precision import checks as unit03

    with pytest.raises(
        AssertionError, match=r"✗ task 1: grad of 0.weight: .*divide by the scale exactly once"
    ):
        unit03.check_underflow_recovery(_kw(_DividesTwice))
    with pytest.raises(AssertionError, match=r"✗ task 2: step \d \(an overflow"):
        unit03.check_scale_schedule(_kw(_NoBackoff))
    with pytest.raises(AssertionError, match=r"✗ task 3: (skipped steps|final scale)"):
        unit03.check_fp16_training(_kw(_NoBackoff))


# --- tasks 4-6: predict a bf16 run, fix an fp16 loop that clips the scaled gradients, state at scale -----
import math  # noqa: E402

import torch  # noqa: E402


def _predict_bf16(w, u, steps):
    """Reasoned, not run in bf16: the update moves the weight by a whole number of bf16 spacings."""
    for _ in range(steps):
        e = math.floor(math.log2(abs(w)))
        spacing = 2.0 ** (e - 7)  # 7 stored mantissa bits
        if u < 0 and w == 2.0**e:
            spacing /= 2  # just below a power of two the spacing halves
        w += round(u / spacing) * spacing
    return w


def _loop(clip_first):
    def train(model, opt, batches, scale, max_norm):
        for x, y in batches:
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.float16):
                out = model(x)
            loss = (out.float() - y).pow(2).mean()
            (loss * scale).backward()
            if clip_first:  # the bug: clips the scaled gradients
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
            found_inf = False
            for p in model.parameters():
                p.grad.div_(scale)
                found_inf = found_inf or not bool(torch.isfinite(p.grad).all())
            if not found_inf:
                if not clip_first:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
                opt.step()

    return train


_BYTES = {"fp32": 16, "paper bf16-mixed": 16, "autocast bf16-mixed": 16, "bf16-true": 8}


def test_unit03_new_tasks_pass_on_right_answers(capsys, seed):
    from course_lib.units.u03_mixed_precision import checks as unit03

    unit03.check_predict_bf16_weight(_predict_bf16)
    unit03.check_clip_bug(_loop(clip_first=False))
    unit03.check_state_at_scale(lambda n, recipe: _BYTES[recipe] * n)
    lines = capsys.readouterr().out.splitlines()
    assert [ln[:8] for ln in lines] == ["✓ task 4", "✓ task 5", "✓ task 6"]


def test_unit03_new_tasks_fail_wrong_answers(seed):
    from course_lib.units.u03_mixed_precision import checks as unit03

    # exact arithmetic (no rounding); an update that vanishes whenever it is below the spacing (S4's rule)
    with pytest.raises(AssertionError, match=r"✗ task 4: weight .*, update .*: you predicted "):
        unit03.check_predict_bf16_weight(lambda w, u, s: w + s * u)
    with pytest.raises(AssertionError, match=r"✗ task 4: weight .*, update "):
        unit03.check_predict_bf16_weight(
            lambda w, u, s: w if abs(u) < 2.0 ** (math.floor(math.log2(w)) - 7) else w + s * u
        )
    with pytest.raises(
        AssertionError, match=r"✗ task 5: parameter 0: .*moved .* less than they should"
    ):
        unit03.check_clip_bug(_loop(clip_first=True))
    # autocast counted as the all-16-bit recipe; an int task answered with a float
    with pytest.raises(AssertionError, match=r"✗ task 6: 7B .* 'autocast bf16-mixed'"):
        unit03.check_state_at_scale(lambda n, r: {**_BYTES, "autocast bf16-mixed": 12}[r] * n)
    with pytest.raises(AssertionError, match=r"✗ task 6: .* must be an int, got float"):
        unit03.check_state_at_scale(lambda n, r: float(_BYTES[r] * n))


def test_unit03_new_tasks_refuse_the_course_answers(seed):
    from course_lib.measure import estimate
    from course_lib.techniques import precision
    from course_lib.units.u03_mixed_precision import checks as unit03
    from course_lib.units.u03_mixed_precision import run as unit03_run

    def from_lecture(w, u, s):
        return float(
            unit03_run.tiny_updates(weight=w, update=u, steps=s)
            .set_index("recipe")
            .loc["bf16", "final"]
        )

    with pytest.raises(AssertionError, match=r"✗ task 4: uses the course's own tiny_updates"):
        unit03.check_predict_bf16_weight(from_lecture)

    def with_course_scaler(model, opt, batches, scale, max_norm):
        scaler = precision.DynamicLossScaler(init_scale=scale)
        for x, y in batches:
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.float16):
                loss = (model(x).float() - y).pow(2).mean()
            scaler.scale(loss).backward()
            if not scaler.unscale_(model.parameters()):
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
                opt.step()

    with pytest.raises(AssertionError, match=r"✗ task 5: uses the course's own DynamicLossScaler"):
        unit03.check_clip_bug(with_course_scaler)
    rows = {
        "fp32": "fp32",
        "paper bf16-mixed": "bf16-mixed",
        "autocast bf16-mixed": "fp32",
        "bf16-true": "bf16-true",
    }
    with pytest.raises(AssertionError, match=r"✗ task 6: uses the course's own model_state_bytes"):
        unit03.check_state_at_scale(
            lambda n, r: estimate.model_state_bytes(n, precision=rows[r])["total"]
        )


def test_copied_answers_fail_under_another_seed(monkeypatch):
    from course_lib.units.u03_mixed_precision import checks as unit03

    copied_fails(monkeypatch, unit03.check_predict_bf16_weight, _predict_bf16, task=4)
    copied_fails(monkeypatch, unit03.check_state_at_scale, lambda n, r: _BYTES[r] * n, task=6)

    # task 2: a scaler that replays seed 0's scales, whatever the flags
    from course_lib.units.u03_mixed_precision import checks_scaler

    monkeypatch.setenv("COURSE_GRADE_SEED", "0")
    seed0 = checks_scaler._gradscaler_scales(
        checks_scaler.schedule(2), init_scale=2.0**10, growth_interval=3
    )

    class Copied(P.DynamicLossScaler):
        def get_scale(self):
            self.calls = getattr(self, "calls", -1) + 1
            return seed0[self.calls]

    unit03.check_scale_schedule(_kw(Copied))
    monkeypatch.setenv("COURSE_GRADE_SEED", "7")
    with pytest.raises(AssertionError, match="✗ task 2: "):
        unit03.check_scale_schedule(_kw(Copied))


def test_lecture_constants_fail(seed):
    """The lecture's run (1.0, 1e-3, 100) stalls at 1.0: answering the start weight fails."""
    from course_lib.units.u03_mixed_precision import checks as unit03

    with pytest.raises(AssertionError, match="✗ task 4: "):
        unit03.check_predict_bf16_weight(lambda w, u, s: w)
