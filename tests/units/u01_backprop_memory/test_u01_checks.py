"""Unit 01's graded checks: a hand-written answer passes, a wrong one fails, the course's own is
refused, under two grading seeds; a table of the default seed's answers fails under another."""

from __future__ import annotations

import pytest
from _grading_seeds import copied_fails, seed_fixture  # noqa: F401 (the seed fixture)

from course_lib import kit
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
    return {
        "params": params,
        "grads": params,
        "optimizer": solution_optimizer_state_bytes(model, optimizer),
        "activations": 4 * batch * (per_hidden * sum(widths[1:-1]) + widths[-1]),
    }


def stub(*args):
    raise NotImplementedError("FILL ME IN (roughly 3 lines)")


def test_optimizer_state_check(seed):
    def no_step_counter(model, optimizer):
        return 4 * {"sgd": 0, "momentum": 1, "adam": 2}[optimizer] * count_params(model)

    said = kit.check_table(
        grading.check_optimizer_state_bytes,
        [
            (solution_optimizer_state_bytes, "✓ task 1"),
            (no_step_counter, r"✗ task 1: .*step' counter per parameter tensor"),
            (stub, "✗ task 1: not implemented yet"),
        ],
        task=1,
    )
    assert said[0] == (
        "✓ task 1: optimizer state matches MemoryMeter on 4 unseen MLPs (SGD, momentum, Adam)"
    )


def test_predict_step_memory_check(seed):
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

    said = kit.check_table(
        grading.check_predict_step_memory,
        [
            (solution_predict_step_memory, "✓ task 2"),
            (relu_everywhere, r"✗ task 2: .*activation=(gelu|silu).*activations.*gelu/silu keep z"),
            (counts_input, r"✗ task 2: .*the input x is created before the step"),
            (missing_key, r"✗ task 2: .*missing \['grads'\]"),
            (stub, "✗ task 2: not implemented yet"),
        ],
        task=2,
    )
    assert said[0] == (
        "✓ task 2: params, grads, optimizer and activations match MemoryMeter exactly on 4 "
        "unseen MLPs"
    )


# ------------------------------------------------------------ tasks 3-5 (predict, bug, scale)
def gpt_activation_bytes(config, batch, seq):
    B, T, C, nh = batch, seq, config.n_embd, config.n_head
    per_layer = 16 * B * T * C + 4 * B * T + nh * B * T * T
    return 4 * (config.n_layer * per_layer + 2 * B * T * C + 2 * B * T + B * T * config.vocab_size)


def test_gpt_activation_check(seed):
    from course_lib.measure import estimate

    def no_logits(config, batch, seq):
        return gpt_activation_bytes(config, batch, seq) - 4 * batch * seq * config.vocab_size

    def thirteen(config, batch, seq):  # the old 13BTC prose
        return (
            gpt_activation_bytes(config, batch, seq)
            - 4 * 3 * config.n_layer * batch * seq * config.n_embd
        )

    def course_own(config, batch, seq):
        return estimate.activation_bytes_gpt(config, batch, seq)

    said = kit.check_table(
        grading.check_gpt_activation_bytes,
        [
            (gpt_activation_bytes, "✓ task 3"),
            (no_logits, r"✗ task 3: .*the logits, B x T x vocab"),
            (thirteen, r"✗ task 3: .* B is not what MemoryMeter measured"),
            (course_own, "✗ task 3: uses the course's own activation_bytes_gpt"),
            (stub, "✗ task 3: not implemented yet"),
        ],
        task=3,
    )
    assert said[0] == (
        "✓ task 3: GPT activation bytes match MemoryMeter exactly (0 B tolerance) on 3 unseen shapes"
    )


def test_eval_memory_bug_check(capsys, seed):
    import torch

    def fixed(model, batches):
        with torch.no_grad():
            return torch.cat([model(x) for x in batches])

    def inference(model, batches):
        with torch.inference_mode():
            return torch.cat([model(x) for x in batches])

    def buggy(model, batches):
        return torch.cat([model(x) for x in batches])

    grading.check_eval_memory_bug("b", fixed, task=4)
    grading.check_eval_memory_bug(" B", inference, task=4)
    assert capsys.readouterr().out.count("✓ task 4: bug named") == 2
    with pytest.raises(AssertionError, match=r"✗ task 4: .*autograd still records a graph"):
        grading.check_eval_memory_bug("b", buggy, task=4)
    with pytest.raises(AssertionError, match=r"✗ task 4: bug 'a' .*not what makes the memory grow"):
        grading.check_eval_memory_bug("a", fixed, task=4)
    with pytest.raises(AssertionError, match=r"✗ task 4: .*outputs differ"):
        grading.check_eval_memory_bug("b", lambda m, b: 2 * fixed(m, b), task=4)
    with pytest.raises(AssertionError, match="✗ task 4: not implemented yet"):
        grading.check_eval_memory_bug("b", stub, task=4)


def scale_up(n_layer, n_embd, n_head, vocab_size, seq):
    from course_lib.models import GPTConfig

    C = n_embd
    params = n_layer * (12 * C * C + 13 * C) + vocab_size * C + seq * C + 2 * C
    config = GPTConfig(
        vocab_size=vocab_size, block_size=seq, n_layer=n_layer, n_head=n_head, n_embd=C
    )
    return {
        "params": params,
        "model_state": 16 * params,
        "activations": gpt_activation_bytes(config, 1, seq),
    }


def test_scale_up_check(capsys, seed):
    from course_lib.measure import estimate

    grading.check_scale_up(scale_up, task=5)
    assert capsys.readouterr().out.strip() == (
        "✓ task 5: 7B-shaped: 6.67B params, 107 GB state, 104 GB activations at 4k tokens; "
        "70B-shaped: 1.04 TB, 516 GB"
    )

    def blocks_only(n_layer, n_embd, n_head, vocab_size, seq):
        out = scale_up(n_layer, n_embd, n_head, vocab_size, seq)
        out["params"] = 12 * n_layer * n_embd**2
        return out

    with pytest.raises(AssertionError, match=r"✗ task 5: drawn .*12 L C\^2 is the blocks' weight"):
        grading.check_scale_up(blocks_only, task=5)

    def uses_estimate(n_layer, n_embd, n_head, vocab_size, seq):
        out = scale_up(n_layer, n_embd, n_head, vocab_size, seq)
        out["model_state"] = estimate.model_state_bytes(out["params"])["total"]
        return out

    with pytest.raises(AssertionError, match="✗ task 5: uses the course's own model_state_bytes"):
        grading.check_scale_up(uses_estimate, task=5)
    with pytest.raises(AssertionError, match="✗ task 5: not implemented yet"):
        grading.check_scale_up(stub, task=5)


def test_eval_memory_bug_check_refuses_the_course_meter():
    import torch

    from course_lib.measure.memory import MemoryMeter

    def measured_by_the_course(model, batches):
        with torch.no_grad(), MemoryMeter(model):
            return torch.cat([model(x) for x in batches])

    with pytest.raises(
        AssertionError, match="✗ task 4: uses the course's own MemoryMeter.__init__"
    ):
        grading.check_eval_memory_bug("b", measured_by_the_course, task=4)


def test_copied_answers_fail_under_another_seed(monkeypatch):
    import torch

    def fixed(model, batches):
        with torch.no_grad():
            return torch.cat([model(x) for x in batches])

    copied_fails(
        monkeypatch, grading.check_optimizer_state_bytes, solution_optimizer_state_bytes, task=1
    )
    copied_fails(
        monkeypatch, grading.check_predict_step_memory, solution_predict_step_memory, task=2
    )
    copied_fails(monkeypatch, grading.check_gpt_activation_bytes, gpt_activation_bytes, task=3)
    copied_fails(monkeypatch, grading.check_eval_memory_bug, fixed, "b", task=4)
    copied_fails(monkeypatch, grading.check_scale_up, scale_up, task=5)


@pytest.mark.parametrize(
    "name, task",
    [
        ("check_optimizer_state_bytes", 1),
        ("check_predict_step_memory", 2),
        ("check_gpt_activation_bytes", 3),
        ("check_eval_memory_bug", 4),
        ("check_scale_up", 5),
    ],
)
def test_the_judge_trusts_nothing_it_is_handed(name, task):
    """Whatever plain data comes back from the learner's side, a malformed one is a ✗ line."""
    import torch

    check = getattr(grading, name)
    forged = [None, 7, "✓", [], [None] * 5, {}, {"bug": "b"}, {"bug": "b", "peak": 0}]
    forged += [{"bug": "b", "peak": 0, "outputs": torch.zeros(2)}, {"7B": {}}]
    for data in forged:
        with pytest.raises(AssertionError, match=f"✗ task {task}: "):
            check.run_judge(data)
