"""Checks for the warm-up exercise of unit 00 (solutions/00_start_here.ipynb).

Each check runs the learner's function on models the learner has not seen and compares it with
what torch itself reports. It prints one deterministic line or raises AssertionError. The models'
widths, vocabularies and the parameter counts of task 3 are drawn from the grading seed
(:func:`course_lib.grading.seeds.case_rng`): a table of answers copied from one grading fails
another.
"""

from __future__ import annotations

import copy
from typing import Any

from course_lib.grading.core import expect_int, fail, fmt_int, passed, run_learner
from course_lib.grading.plain import bug_data, judge_bug
from course_lib.grading.seeds import case_rng
from course_lib.grading.split import need, need_list, split_check

UNIT = "u00_start_here"


def _unseen_models(task: int):
    """Small models with the cases that trip people up: biases, norms, embeddings, tied weights;
    their sizes drawn for ``task`` from the grading seed."""
    import torch
    from torch import nn

    rng = case_rng(task, UNIT)
    torch.manual_seed(rng.getrandbits(31))
    d_in, hidden, d_out = rng.randint(20, 60), rng.randint(32, 96), rng.randint(3, 15)
    mlp = nn.Sequential(nn.Linear(d_in, hidden), nn.GELU(), nn.Linear(hidden, d_out, bias=False))
    w = rng.randint(8, 24)
    norm_net = nn.Sequential(nn.Linear(w, w), nn.LayerNorm(w), nn.Linear(w, rng.randint(2, 6)))

    class TiedLM(nn.Module):
        """Input embedding and output head share one weight: it must be counted once."""

        def __init__(self, vocab: int, dim: int):
            super().__init__()
            self.embed = nn.Embedding(vocab, dim)
            self.norm = nn.LayerNorm(dim)
            self.head = nn.Linear(dim, vocab, bias=False)
            self.head.weight = self.embed.weight  # weight tying, as in GPT-2

    f = rng.randint(5, 12)
    frozen = nn.Sequential(nn.Linear(f, f), nn.Linear(f, rng.randint(2, 4)))
    frozen[0].requires_grad_(False)  # frozen parameters still take memory
    tied = TiedLM(rng.randint(30, 90), rng.randint(8, 20))
    return {"mlp": mlp, "norm_net": norm_net, "tied_lm": tied, "frozen": frozen}


#: the course's own answers, out of reach while the learner's function runs
_COUNT_REFERENCES = ("course_lib.models:count_params",)
_STATE_REFERENCES = (
    "course_lib.measure.estimate.memory:model_state_bytes",
    "course_lib.measure.estimate.memory:optimizer_state_bytes_per_param",
)


def collect_count_parameters(count_parameters, task: int = 1) -> dict[str, Any]:
    """Task: count a model's parameters (shared tensors once, frozen ones included)."""
    return {
        name: run_learner(task, count_parameters, model, forbid=_COUNT_REFERENCES)
        for name, model in _unseen_models(task).items()
    }


def judge_count_parameters(data: Any, task: int = 1) -> None:
    for name, model in _unseen_models(task).items():
        expected = sum(p.numel() for p in model.parameters())
        got = data.get(name) if isinstance(data, dict) else None
        expect_int(task, f"the parameter count of model '{name}'", got)
        if got != expected:
            tied = name == "tied_lm" and got > expected
            hint = " (a tied weight is one tensor: count it once)" if tied else ""
            fail(task, f"model '{name}': parameter count {got!r} is not the model's{hint}")
    passed(
        task,
        "parameter counts match on 4 unseen models (biases, a norm, a tied and a frozen layer)",
    )


check_count_parameters = split_check(collect_count_parameters, judge_count_parameters)

_DTYPES = ("float32", "bfloat16", "float16", "float64")


def _bytes_in(model, dtype) -> int:
    """The bytes ``model``'s parameters take once converted to ``dtype`` (a copy is converted)."""
    return sum(p.numel() * p.element_size() for p in copy.deepcopy(model).to(dtype).parameters())


def collect_parameter_bytes(parameter_bytes, task: int = 2) -> list[Any]:
    """Task: bytes the parameters take when stored in a given dtype, checked by converting."""
    import torch

    model = _unseen_models(task)["tied_lm"]
    return [
        run_learner(task, parameter_bytes, model, getattr(torch, name), forbid=_COUNT_REFERENCES)
        for name in _DTYPES
    ]


def judge_parameter_bytes(data: Any, task: int = 2) -> None:
    import torch

    model = _unseen_models(task)["tied_lm"]
    for name, got in zip(_DTYPES, need_list(task, data, len(_DTYPES), "answer", "dtypes")):
        dtype = getattr(torch, name)
        expect_int(task, f"the bytes for {dtype}", got)
        if got != _bytes_in(model, dtype):
            fail(task, f"dtype {dtype}: {got!r} B is not what the converted parameters take")
    passed(task, "parameter bytes match for fp32, bf16, fp16 and fp64 on an unseen tied model")


check_parameter_bytes = split_check(collect_parameter_bytes, judge_parameter_bytes)


def _state_sizes(task: int) -> list[int]:
    rng = case_rng(task, UNIT)
    drawn = [rng.randint(2, 9_999), rng.randint(10**7, 10**9), rng.randint(10**9, 4 * 10**11)]
    return [1, *drawn, 7_000_000_000, 70_000_000_000]


def collect_adam_training_bytes(adam_training_bytes, task: int = 3) -> list[Any]:
    """Task: fp32 training with Adam keeps params, grads and two states: 16 bytes per parameter."""
    return [
        run_learner(task, adam_training_bytes, n, forbid=_STATE_REFERENCES)
        for n in _state_sizes(task)
    ]


def judge_adam_training_bytes(data: Any, task: int = 3) -> None:
    from course_lib.measure import estimate

    sizes = _state_sizes(task)
    answers = dict(zip(sizes, need_list(task, data, len(sizes), "answer")))
    for n_params, got in answers.items():
        expected = estimate.model_state_bytes(n_params, precision="fp32", optimizer="adam")["total"]
        expect_int(task, f"the bytes for n_params={fmt_int(n_params)}", got)
        if got != expected:
            hint = ""
            if got in (4 * n_params, 8 * n_params, 12 * n_params):
                hint = f" ({got // n_params} B/param: count the weight, its gradient and Adam's two averages)"
            fail(
                task,
                f"n_params={fmt_int(n_params)}: {got!r} B is not the model state{hint}",
            )
    passed(
        task,
        f"Adam fp32 model state: 7B parameters -> {answers[7 * 10**9] / 1e9:g} GB, "
        f"70B -> {answers[70 * 10**9] / 1e12:g} TB",
    )


check_adam_training_bytes = split_check(collect_adam_training_bytes, judge_adam_training_bytes)


# ---------------------------------------------------------------------------------- task 4
def _unseen_gpts(task: int):
    """GPT shapes the lecture did not show, drawn from the grading seed: one with biases and a
    tied head, one without biases, one with an untied head."""
    from course_lib.models import GPTConfig

    rng = case_rng(task, UNIT)
    out = []
    for extra in ({}, {"bias": False}, {"tie_weights": False}):
        n_head = rng.randint(1, 4)
        out.append(
            GPTConfig.tiny(
                n_layer=rng.randint(1, 3),
                n_embd=n_head * rng.choice((8, 12, 16)),
                n_head=n_head,
                block_size=rng.choice((8, 16, 24)),
                vocab_size=rng.randint(20, 70),
                **extra,
            )
        )
    return out


def _gpt(config):
    """The GPT a task-4 case is about (the same weights on both sides of the grade)."""
    import torch

    from course_lib.models import GPT

    torch.manual_seed(0)
    return GPT(config)


def _measure_gpt_state(config) -> dict[str, int]:
    """One Adam step (fp32, torch.optim defaults) of a GPT under MemoryMeter: the model state at
    the end of the step, and the parameter count ``n`` (for the hints)."""
    import torch
    import torch.nn.functional as F

    from course_lib.measure.memory import MemoryMeter

    model = _gpt(config)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    idx = torch.randint(0, config.vocab_size, (2, config.block_size))
    with MemoryMeter(model, opt) as mem:
        F.cross_entropy(model(idx).flatten(0, 1), idx.flatten()).backward()
        opt.step()
    measured = {k: int(mem.end_breakdown[k]) for k in ("params", "grads", "optimizer")}
    return {**measured, "n": sum(p.numel() for p in model.parameters())}


_MEASURE_REFERENCES = (
    "course_lib.models:count_params",
    "course_lib.measure.memory:MemoryMeter",
    *_STATE_REFERENCES,
    "course_lib.measure.estimate.training:gpt_param_count",
)


def collect_predict_measured_state(predict_state, task: int = 4) -> list[Any]:
    """Task (predict, then measure): the params, grads and optimizer bytes MemoryMeter reports
    after one Adam step of a GPT the learner has not seen, residuals included (exact: 0 B)."""
    return [
        run_learner(task, predict_state, _gpt(config), forbid=_MEASURE_REFERENCES)
        for config in _unseen_gpts(task)
    ]


def expect_predict_measured_state(task: int = 4) -> list[dict[str, int]]:
    """What MemoryMeter measures on each unseen GPT (and its parameter count, for the hints):
    the grade measures it while the learner's side runs."""
    return [_measure_gpt_state(config) for config in _unseen_gpts(task)]


def judge_predict_measured_state(data: Any, task: int = 4, expected: Any = None) -> None:
    configs = _unseen_gpts(task)
    expected = expected if expected is not None else expect_predict_measured_state(task)
    keys = ("params", "grads", "optimizer")
    for config, got, measured in zip(configs, need_list(task, data, 3, "answer"), expected):
        if not isinstance(got, dict) or any(k not in got for k in keys):
            fail(task, f"expected a dict with keys {list(keys)}, got {got!r}")
        for key in keys:
            expect_int(task, f"{key} (bytes)", got[key])
            if got[key] != measured[key]:
                hint = ""
                if key == "params" and got[key] == 4 * measured["n"]:
                    hint = " (the meter files the model's buffers under params too)"
                elif key == "optimizer" and got[key] == 8 * measured["n"]:
                    hint = " (Adam also keeps a 'step' counter per parameter tensor)"
                fail(
                    task,
                    f"GPT n_layer={config.n_layer} n_embd={config.n_embd} bias={config.bias} "
                    f"tie_weights={config.tie_weights}: {key}: {got[key]!r} B is not what "
                    f"MemoryMeter measured{hint}",
                )
    passed(
        task,
        "params, grads and optimizer bytes match MemoryMeter exactly (0 B tolerance) on 3 unseen GPTs",
    )


check_predict_measured_state = split_check(
    collect_predict_measured_state,
    judge_predict_measured_state,
    expect=expect_predict_measured_state,
)


# ---------------------------------------------------------------------------------- task 5
#: the one right diagnosis of the buggy weight_bytes in solutions/00_start_here.ipynb
BUG_CHOICES = {
    "a": "it multiplies by the wrong element size",
    "b": "state_dict() lists a tied weight once per name and also holds buffers, so it overcounts",
    "c": "it leaves out frozen parameters",
    "d": "it counts the gradients as well as the weights",
}


def _bug_models(task: int) -> dict[str, Any]:
    import torch
    from torch import nn

    models = _unseen_models(task)
    rng = case_rng(task, UNIT)
    vocab, dim, positions = rng.randint(12, 40), rng.randint(4, 10), rng.randint(8, 32)

    class TiedWithBuffer(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(vocab, dim)
            self.head = nn.Linear(dim, vocab, bias=False)
            self.head.weight = self.embed.weight
            self.register_buffer("positions", torch.arange(positions))

    models["tied_with_buffer"] = TiedWithBuffer()
    return models


def collect_weight_bytes_bug(bug: str, weight_bytes, task: int = 5) -> dict[str, Any]:
    """Task (find the bug): name what is wrong with a state_dict-based byte count, and fix it."""
    import torch

    got = {}
    if isinstance(bug, str) and bug.strip().lower() == "b":  # the fix is run only then
        for name, model in _bug_models(task).items():
            for dtype in ("float32", "bfloat16"):
                got[f"{name}/{dtype}"] = run_learner(
                    task, weight_bytes, model, getattr(torch, dtype), forbid=_COUNT_REFERENCES
                )
    return {**bug_data(bug), "bytes": got}


def judge_weight_bytes_bug(data: Any, task: int = 5) -> None:
    import torch

    judge_bug(
        task,
        data,
        BUG_CHOICES,
        "b",
        "that is not what goes wrong; compare the buggy count with "
        "sum(p.numel() for p in model.parameters())",
    )
    got_all = need(task, data, "bytes", dict, "weight bytes")
    for name, model in _bug_models(task).items():
        for dtype_name in ("float32", "bfloat16"):
            dtype = getattr(torch, dtype_name)
            got = got_all.get(f"{name}/{dtype_name}")
            expect_int(task, f"the weight bytes of '{name}'", got)
            if got != _bytes_in(model, dtype):
                fail(task, f"model '{name}', {dtype}: {got!r} B is not what its parameters take")
    passed(task, "bug named (state_dict overcounts) and the fixed count matches on 5 models")


check_weight_bytes_bug = split_check(collect_weight_bytes_bug, judge_weight_bytes_bug)
