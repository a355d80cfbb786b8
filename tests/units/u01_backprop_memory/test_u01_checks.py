"""Unit 01's graded checks."""
from __future__ import annotations

import pytest

from course_lib.models import count_params
from course_lib.units.u01_backprop_memory import checks as grading


# ----------------------------------------------------------------------- graded checks
# a learner's answers, written by hand (the course's estimate is out of reach in the checks)
def solution_optimizer_state_bytes(model, optimizer):
    buffers = {"sgd": 0, "momentum": 1, "adam": 2}[optimizer]
    counters = len(list(model.parameters())) if optimizer == "adam" else 0
    return 4 * (buffers * count_params(model) + counters)


def solution_predict_step_memory(model, batch_shape, optimizer):
    (batch,) = batch_shape
    params = 4 * count_params(model)
    widths = model.config.widths
    per_hidden = 2 if model.config.activation in ("gelu", "silu") else 1
    return {"params": params, "grads": params,
            "optimizer": solution_optimizer_state_bytes(model, optimizer),
            "activations": 4 * batch * (per_hidden * sum(widths[1:-1]) + widths[-1])}


def stub(*args):
    raise NotImplementedError("FILL ME IN (roughly 3 lines)")


def test_optimizer_state_check(capsys):
    grading.check_optimizer_state_bytes(solution_optimizer_state_bytes, task=1)
    out = capsys.readouterr().out.strip()
    assert out.startswith("✓ task 1: optimizer state matches MemoryMeter on 4 unseen MLPs")

    def no_step_counter(model, optimizer):
        return 4 * {"sgd": 0, "momentum": 1, "adam": 2}[optimizer] * count_params(model)

    with pytest.raises(AssertionError, match=r"✗ task 1: .*step' counter per parameter tensor"):
        grading.check_optimizer_state_bytes(no_step_counter, task=1)
    with pytest.raises(AssertionError, match="✗ task 1: not implemented yet"):
        grading.check_optimizer_state_bytes(stub, task=1)


def test_predict_step_memory_check(capsys):
    grading.check_predict_step_memory(solution_predict_step_memory, task=2)
    assert capsys.readouterr().out.strip() == (
        "✓ task 2: params, grads, optimizer and activations match MemoryMeter exactly on 4 "
        "unseen MLPs")

    def relu_everywhere(model, batch_shape, optimizer):
        out = solution_predict_step_memory(model, batch_shape, optimizer)
        out["activations"] = 4 * batch_shape[0] * sum(model.config.widths[1:])
        return out

    def counts_input(model, batch_shape, optimizer):
        out = solution_predict_step_memory(model, batch_shape, optimizer)
        out["activations"] += 4 * batch_shape[0] * model.config.in_features
        return out

    def missing_key(model, batch_shape, optimizer):
        out = solution_predict_step_memory(model, batch_shape, optimizer)
        del out["grads"]
        return out

    with pytest.raises(AssertionError, match=r"✗ task 2: .*activation=gelu.*activations.*gelu/silu keep z"):
        grading.check_predict_step_memory(relu_everywhere, task=2)
    with pytest.raises(AssertionError, match=r"✗ task 2: .*the input x is created before the step"):
        grading.check_predict_step_memory(counts_input, task=2)
    with pytest.raises(AssertionError, match=r"✗ task 2: .*missing \['grads'\]"):
        grading.check_predict_step_memory(missing_key, task=2)
    with pytest.raises(AssertionError, match="✗ task 2: not implemented yet"):
        grading.check_predict_step_memory(stub, task=2)
