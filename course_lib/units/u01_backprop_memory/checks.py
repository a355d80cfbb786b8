"""Checks for the exercises of unit 01 (solutions/01_backprop_memory.ipynb).

Tasks 1-3 build models the learner has not seen, run a real step (or forward) under
MemoryMeter, and compare the learner's prediction with what was measured. Each check is split
(:mod:`course_lib.grading.split`): ``collect_X`` calls the learner's function on the drawn cases
and hands back its answers; ``judge_X`` draws the cases again, measures and compares.

Task 1: optimizer_state_bytes(model, optimizer) -> bytes of optimizer state after one step.
Task 2: predict_step_memory(model, batch_shape, optimizer) -> bytes per category.
Task 3 (predict, then measure): gpt_activation_bytes(config, batch, seq) -> bytes autograd keeps
        when a GPT's forward ends, on GPT shapes the lecture did not show (exact).
Task 4 (find the bug): an evaluation loop that keeps every batch's activations alive; name the
        bug and fix it (graded by the measured peak; in :mod:`.checks_eval`).
Task 5 (scale it up): parameters, model state and activations of GPT-shaped 7B and 70B models at
        4,096 tokens, and a GPT shape drawn per grading, against estimate (:mod:`.checks_scale`).

Every case (widths, batch, optimizer order, GPT shapes) is drawn from the grading seed
(:func:`course_lib.grading.seeds.case_rng`), so answers copied from one grading fail another.
"""

from __future__ import annotations

from typing import Any

from course_lib.grading.core import expect_int, fail, passed, run_learner
from course_lib.grading.plain import type_name
from course_lib.grading.seeds import case_rng
from course_lib.grading.split import need_list, split_check
from course_lib.units.u01_backprop_memory.checks_eval import (  # noqa: F401 (re-exported)
    EVAL_BUG_CHOICES,
    check_eval_memory_bug,
)
from course_lib.units.u01_backprop_memory.checks_scale import (  # noqa: F401 (re-exported)
    SCALE_CASES,
    check_scale_up,
)

UNIT = "u01_backprop_memory"

_CATEGORIES = ("params", "grads", "optimizer", "activations")


def _unseen_cases(task: int):
    """Random MLPs drawn from the grading seed: widths, depth, batch; every activation (relu/tanh
    keep one tensor, gelu/silu two) and optimizer (Adam twice), in a drawn order; one without
    biases."""
    import torch

    from course_lib.models import MLP, MLPConfig

    rng = case_rng(task, UNIT)
    activations = ["relu", "gelu", "tanh", "silu"]
    optimizers = ["adam", "momentum", "sgd", "adam"]
    rng.shuffle(activations)
    rng.shuffle(optimizers)
    no_bias = rng.randrange(4)
    cases = []
    for i in range(4):
        depth = rng.randint(1, 3)
        cfg = MLPConfig(
            in_features=rng.randint(3, 40),
            hidden=tuple(rng.randint(4, 96) for _ in range(depth)),
            out_features=rng.randint(2, 12),
            activation=activations[i],
            bias=(i != no_bias),
        )
        torch.manual_seed(rng.getrandbits(31))
        cases.append((MLP(cfg), (rng.randint(2, 48),), optimizers[i]))
    return cases


#: the course's own answers (and the meter the check measures with), out of reach while the
#: learner's function runs: the task is to predict, from the model, what the meter will say
_REFERENCES = (
    "course_lib.measure.estimate.memory:model_state_bytes",
    "course_lib.measure.estimate.memory:optimizer_state_bytes_per_param",
    "course_lib.measure.estimate.activations:activation_bytes_mlp",
    "course_lib.measure.estimate.activations:activation_bytes_gpt",
    "course_lib.techniques.optim:state_bytes",
    "course_lib.measure.memory:MemoryMeter",
)


def _describe(model, batch_shape, optimizer) -> str:
    c = model.config
    return (
        f"MLP widths={c.widths} activation={c.activation} bias={c.bias}, "
        f"batch_shape={tuple(batch_shape)}, optimizer={optimizer!r}"
    )


def _measure(model, batch_shape, optimizer) -> dict:
    """One real training step of a copy of `model` under MemoryMeter, per category: params,
    grads and optimizer at their largest over the step; activations when the forward ends
    (the lecture's own measurement, run on the judge's side)."""
    from course_lib.units.u01_backprop_memory.run import measure_step_memory

    return measure_step_memory(model, batch_shape, optimizer)


def collect_optimizer_state_bytes(optimizer_state_bytes, task: int = 1) -> list[Any]:
    """Task: bytes of optimizer state torch.optim keeps after one step (exact)."""
    return [
        run_learner(task, optimizer_state_bytes, model, opt, forbid=_REFERENCES)
        for model, _, opt in _unseen_cases(task)
    ]


def judge_optimizer_state_bytes(data: Any, task: int = 1) -> None:
    cases = _unseen_cases(task)
    for (model, batch_shape, opt), got in zip(cases, need_list(task, data, len(cases), "answer")):
        expected = _measure(model, batch_shape, opt)["optimizer"]
        expect_int(task, f"the optimizer-state bytes ({opt})", got)
        if got != expected:
            hint = ""
            n_tensors = len(list(model.parameters()))
            if isinstance(got, int) and expected - got == 4 * n_tensors and opt == "adam":
                hint = (
                    f" (Adam also keeps a 4-byte 'step' counter per parameter tensor: "
                    f"{n_tensors} tensors)"
                )
            fail(
                task,
                f"{_describe(model, batch_shape, opt)}: {got!r} B is not what MemoryMeter "
                f"measured{hint}",
            )
    passed(task, "optimizer state matches MemoryMeter on 4 unseen MLPs (SGD, momentum, Adam)")


check_optimizer_state_bytes = split_check(
    collect_optimizer_state_bytes, judge_optimizer_state_bytes
)


def collect_predict_step_memory(predict_step_memory, task: int = 2) -> list[Any]:
    """Task: predicted bytes per category = what MemoryMeter measures, on unseen MLPs (exact)."""
    return [
        run_learner(task, predict_step_memory, model, batch_shape, opt, forbid=_REFERENCES)
        for model, batch_shape, opt in _unseen_cases(task)
    ]


def judge_predict_step_memory(data: Any, task: int = 2) -> None:
    cases = _unseen_cases(task)
    for (model, batch_shape, opt), got in zip(cases, need_list(task, data, len(cases), "answer")):
        measured = _measure(model, batch_shape, opt)
        if not isinstance(got, dict):
            fail(task, f"expected a dict with keys {list(_CATEGORIES)}, got {type_name(got)}")
        missing = [c for c in _CATEGORIES if c not in got]
        if missing:
            fail(task, f"expected a dict with keys {list(_CATEGORIES)}, missing {missing}")
        for c in _CATEGORIES:
            expect_int(task, f"{c} (bytes)", got[c])
            if got[c] != measured[c]:
                hint = _hint(c, model, batch_shape, opt, got[c], measured[c])
                fail(
                    task,
                    f"{_describe(model, batch_shape, opt)}: {c}: {got[c]!r} B is not what "
                    f"MemoryMeter measured{hint}",
                )
    passed(
        task, "params, grads, optimizer and activations match MemoryMeter exactly on 4 unseen MLPs"
    )


check_predict_step_memory = split_check(collect_predict_step_memory, judge_predict_step_memory)


def _hint(category, model, batch_shape, opt, got, expected) -> str:
    if not isinstance(got, int):
        return " (bytes are ints)"
    if category == "activations":
        from course_lib.measure import estimate

        batch, widths = batch_shape[0], model.config.widths
        other_rule = {
            estimate.activation_bytes_mlp(batch, widths, activation=a) for a in ("relu", "gelu")
        } - {expected}
        if got in other_rule:
            return " (check what the activation saves: relu/tanh keep u, gelu/silu keep z too)"
        if got - expected == 4 * batch * model.config.in_features:
            return " (the input x is created before the step: it is not an activation here)"
        return " (count what each layer keeps: every hidden output, the output layer's output)"
    if category == "optimizer":
        return " (buffers per parameter: SGD 0, momentum 1, Adam 2 plus a step counter per tensor)"
    return ""


# ---------------------------------------------------------------------------------- task 3
_GPT_REFERENCES = (
    "course_lib.measure.estimate.activations:activation_bytes_gpt",
    "course_lib.measure.estimate.activations:activation_bytes_transformer_layer",
    "course_lib.measure.estimate.checkpointing:checkpointed_activation_bytes_gpt",
    "course_lib.measure.memory:MemoryMeter",
)


def _unseen_gpt_cases(task: int):
    """(config, batch, seq): shapes the lecture did not show, drawn from the grading seed; one
    without biases, seq below block_size in one, a single head in one."""
    from course_lib.models import GPTConfig

    rng = case_rng(task, UNIT)
    short, no_bias, one_head = rng.sample(range(3), 3)
    cases = []
    for i in range(3):
        n_head = 1 if i == one_head else rng.randint(2, 6)
        block = rng.choice((16, 24, 32, 40))
        config = GPTConfig.tiny(
            n_layer=rng.randint(1, 3),
            n_embd=n_head * rng.choice((4, 8, 12)),
            n_head=n_head,
            block_size=block,
            vocab_size=rng.randint(20, 100),
            bias=i != no_bias,
        )
        cases.append(
            (config, rng.randint(1, 5), rng.randint(4, block - 4) if i == short else block)
        )
    return cases


def _measure_gpt_forward(config, batch: int, seq: int) -> int:
    """Bytes filed as activations when the forward of a GPT ends (the logits held)."""
    import torch

    from course_lib.measure.memory import MemoryMeter
    from course_lib.models import GPT

    torch.manual_seed(0)
    model = GPT(config)
    idx = torch.randint(0, config.vocab_size, (batch, seq))
    with MemoryMeter(model) as mem:
        logits = model(idx)
    del logits
    return int(mem.end_breakdown["activations"])


def collect_gpt_activation_bytes(gpt_activation_bytes, task: int = 3) -> list[Any]:
    """Task (predict, then measure): activation bytes of a GPT forward, exact (0 B tolerance)."""
    return [
        run_learner(task, gpt_activation_bytes, config, batch, seq, forbid=_GPT_REFERENCES)
        for config, batch, seq in _unseen_gpt_cases(task)
    ]


def judge_gpt_activation_bytes(data: Any, task: int = 3) -> None:
    cases = _unseen_gpt_cases(task)
    for (config, batch, seq), got in zip(cases, need_list(task, data, len(cases), "answer")):
        measured = _measure_gpt_forward(config, batch, seq)
        expect_int(task, "the activation bytes", got)
        if got != measured:
            B, T, C, nh = batch, seq, config.n_embd, config.n_head
            hint = ""
            if got - measured == -4 * B * T * config.vocab_size:
                hint = " (the logits, B x T x vocab, are alive when the forward ends)"
            elif got - measured == -4 * (2 * B * T * C + 2 * B * T):
                hint = " (the final LayerNorm keeps its input, output, mean and rstd too)"
            elif (measured - got) % (4 * config.n_layer * B * T * T) == 0:
                hint = " (each head keeps its T x T attention probabilities)"
            fail(
                task,
                f"GPT n_layer={config.n_layer} n_embd={C} n_head={nh} vocab={config.vocab_size}, "
                f"batch {B} x seq {T}: {got!r} B is not what MemoryMeter measured{hint}",
            )
    passed(
        task, "GPT activation bytes match MemoryMeter exactly (0 B tolerance) on 3 unseen shapes"
    )


check_gpt_activation_bytes = split_check(collect_gpt_activation_bytes, judge_gpt_activation_bytes)
