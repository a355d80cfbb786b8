"""Unit 00's graded checks, each three ways: a hand-written answer passes, a wrong one fails with a
✗ verdict, one that calls the course's own answer is refused."""

from __future__ import annotations

import pytest
import torch

from course_lib.measure import estimate
from course_lib.models import count_params
from course_lib.units.u00_start_here import checks as grading


def stub(*args):
    raise NotImplementedError("FILL ME IN (roughly 3 lines)")


def test_scale_it_up_adam_bytes(capsys):
    grading.check_adam_training_bytes(lambda n: 16 * n, task=3)
    assert capsys.readouterr().out.strip() == (
        "✓ task 3: Adam fp32 model state: 7B parameters -> 112 GB, 70B -> 1.12 TB"
    )
    with pytest.raises(AssertionError, match=r"✗ task 3: .*12 B/param: count the weight"):
        grading.check_adam_training_bytes(lambda n: 12 * n, task=3)
    with pytest.raises(AssertionError, match="✗ task 3: uses the course's own model_state_bytes"):
        grading.check_adam_training_bytes(lambda n: estimate.model_state_bytes(n)["total"], task=3)
    with pytest.raises(AssertionError, match="✗ task 3: not implemented yet"):
        grading.check_adam_training_bytes(stub, task=3)


def predict_state(model):
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    n_tensors = len(list(model.parameters()))
    return {"params": weights + buffers, "grads": weights, "optimizer": 2 * weights + 4 * n_tensors}


def test_predict_measured_state(capsys):
    grading.check_predict_measured_state(predict_state, task=4)
    assert (
        capsys.readouterr()
        .out.strip()
        .startswith("✓ task 4: params, grads and optimizer bytes match")
    )

    def formula_only(model):  # the lecture's prediction, without the residuals it explained
        n = sum(p.numel() for p in model.parameters())
        return {"params": 4 * n, "grads": 4 * n, "optimizer": 8 * n}

    with pytest.raises(
        AssertionError, match=r"✗ task 4: .*params: expected .*buffers under params"
    ):
        grading.check_predict_measured_state(formula_only, task=4)

    def no_counters(model):
        out = predict_state(model)
        out["optimizer"] = 8 * sum(p.numel() for p in model.parameters())
        return out

    with pytest.raises(AssertionError, match=r"✗ task 4: .*step' counter per parameter tensor"):
        grading.check_predict_measured_state(no_counters, task=4)

    def uses_count_params(model):
        out = predict_state(model)
        out["grads"] = 4 * count_params(model)
        return out

    with pytest.raises(AssertionError, match="✗ task 4: uses the course's own count_params"):
        grading.check_predict_measured_state(uses_count_params, task=4)
    with pytest.raises(AssertionError, match="✗ task 4: not implemented yet"):
        grading.check_predict_measured_state(stub, task=4)


def weight_bytes(model, dtype):
    return sum(p.numel() for p in model.parameters()) * torch.empty((), dtype=dtype).element_size()


def buggy_weight_bytes(model, dtype):
    return (
        sum(t.numel() for t in model.state_dict().values())
        * torch.empty((), dtype=dtype).element_size()
    )


def test_find_the_bug(capsys):
    grading.check_weight_bytes_bug("b", weight_bytes, task=5)
    assert capsys.readouterr().out.strip() == (
        "✓ task 5: bug named (state_dict overcounts) and the fixed count matches on 5 models"
    )
    with pytest.raises(AssertionError, match=r"✗ task 5: bug 'a' .*not what goes wrong"):
        grading.check_weight_bytes_bug("a", weight_bytes, task=5)
    with pytest.raises(AssertionError, match=r"✗ task 5: bug must be one of"):
        grading.check_weight_bytes_bug("the state dict", weight_bytes, task=5)
    with pytest.raises(AssertionError, match=r"✗ task 5: model 'tied_lm'.*expected"):
        grading.check_weight_bytes_bug("b", buggy_weight_bytes, task=5)
    with pytest.raises(AssertionError, match="✗ task 5: uses the course's own count_params"):
        grading.check_weight_bytes_bug(
            "b", lambda m, dt: count_params(m) * torch.empty((), dtype=dt).element_size(), task=5
        )
    with pytest.raises(AssertionError, match="✗ task 5: not implemented yet"):
        grading.check_weight_bytes_bug("b", stub, task=5)
