"""Checks for the warm-up exercise of unit 00 (solutions/00_start_here.ipynb).

Each check runs the learner's function on models the learner has not seen and compares it with
what torch itself reports. It prints one deterministic line or raises AssertionError.
"""

from __future__ import annotations

import copy
from typing import Any

from course_lib.grading.core import expect_int, fail, fmt_int, passed, run_learner


def _unseen_models():
    """Small models with the cases that trip people up: biases, norms, embeddings, tied weights."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(37, 64), nn.GELU(), nn.Linear(64, 10, bias=False))
    norm_net = nn.Sequential(nn.Linear(16, 16), nn.LayerNorm(16), nn.Linear(16, 3))

    class TiedLM(nn.Module):
        """Input embedding and output head share one weight: it must be counted once."""

        def __init__(self, vocab: int = 50, dim: int = 12):
            super().__init__()
            self.embed = nn.Embedding(vocab, dim)
            self.norm = nn.LayerNorm(dim)
            self.head = nn.Linear(dim, vocab, bias=False)
            self.head.weight = self.embed.weight  # weight tying, as in GPT-2

    frozen = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2))
    frozen[0].requires_grad_(False)  # frozen parameters still take memory
    return {"mlp": mlp, "norm_net": norm_net, "tied_lm": TiedLM(), "frozen": frozen}


#: the course's own answers, out of reach while the learner's function runs
_COUNT_REFERENCES = ("course_lib.models:count_params",)
_STATE_REFERENCES = (
    "course_lib.measure.estimate.memory:model_state_bytes",
    "course_lib.measure.estimate.memory:optimizer_state_bytes_per_param",
)


def check_count_parameters(count_parameters, task: int = 1) -> None:
    """Task: count a model's parameters (shared tensors once, frozen ones included)."""
    total = 0
    for name, model in _unseen_models().items():
        expected = sum(p.numel() for p in model.parameters())
        got = run_learner(task, count_parameters, model, forbid=_COUNT_REFERENCES)
        expect_int(task, f"the parameter count of model '{name}'", got)
        if got != expected:
            hint = ""
            if name == "tied_lm" and got > expected:
                hint = " (a tied weight is one tensor: count it once)"
            fail(
                task, f"model '{name}': expected {fmt_int(expected)} parameters, got {got!r}{hint}"
            )
        total += expected
    passed(task, f"parameter counts match on 4 unseen models ({fmt_int(total)} parameters in all)")


def check_parameter_bytes(parameter_bytes, task: int = 2) -> None:
    """Task: bytes the parameters take when stored in a given dtype, checked by converting."""
    import torch

    dtypes = [torch.float32, torch.bfloat16, torch.float16, torch.float64]
    model = _unseen_models()["tied_lm"]
    total = 0
    for dtype in dtypes:
        converted = copy.deepcopy(model).to(dtype)
        expected = sum(p.numel() * p.element_size() for p in converted.parameters())
        got = run_learner(task, parameter_bytes, model, dtype, forbid=_COUNT_REFERENCES)
        expect_int(task, f"the bytes for {dtype}", got)
        if got != expected:
            fail(task, f"dtype {dtype}: expected {fmt_int(expected)} B, got {got!r}")
        total += expected
    passed(task, f"parameter bytes match for fp32, bf16, fp16 and fp64 ({fmt_int(total)} B in all)")


def check_adam_training_bytes(adam_training_bytes, task: int = 3) -> None:
    """Task: fp32 training with Adam keeps params, grads and two states: 16 bytes per parameter."""
    from course_lib.measure import estimate

    results = {}
    for n_params in (1, 1_000, 124_439_808, 7_000_000_000, 70_000_000_000):
        expected = estimate.model_state_bytes(n_params, precision="fp32", optimizer="adam")["total"]
        got = run_learner(task, adam_training_bytes, n_params, forbid=_STATE_REFERENCES)
        expect_int(task, f"the bytes for n_params={fmt_int(n_params)}", got)
        if got != expected:
            hint = ""
            if isinstance(got, int) and got in (4 * n_params, 8 * n_params, 12 * n_params):
                hint = f" ({got // n_params} B/param: count the weight, its gradient and Adam's two averages)"
            fail(
                task,
                f"n_params={fmt_int(n_params)}: expected {fmt_int(expected)} B, got {got!r}{hint}",
            )
        results[n_params] = got
    passed(
        task,
        f"Adam fp32 model state: 7B parameters -> {results[7 * 10**9] / 1e9:g} GB, "
        f"70B -> {results[70 * 10**9] / 1e12:g} TB",
    )


# ---------------------------------------------------------------------------------- task 4
def _unseen_gpts():
    """GPT shapes the lecture did not show (seeded: the verdict is deterministic)."""
    from course_lib.models import GPTConfig

    return [
        GPTConfig.tiny(n_layer=3, n_embd=48, n_head=3, block_size=32, vocab_size=50),
        GPTConfig.tiny(n_layer=1, n_embd=32, n_head=2, block_size=16, vocab_size=30, bias=False),
        GPTConfig.tiny(
            n_layer=2, n_embd=40, n_head=4, block_size=24, vocab_size=41, tie_weights=False
        ),
    ]


def _measure_gpt_state(config) -> tuple[dict[str, int], Any]:
    """One Adam step (fp32, torch.optim defaults) of a GPT under MemoryMeter; the model state at
    the end of the step."""
    import torch
    import torch.nn.functional as F

    from course_lib.measure.memory import MemoryMeter
    from course_lib.models import GPT

    torch.manual_seed(0)
    model = GPT(config)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    idx = torch.randint(0, config.vocab_size, (2, config.block_size))
    with MemoryMeter(model, opt) as mem:
        F.cross_entropy(model(idx).flatten(0, 1), idx.flatten()).backward()
        opt.step()
    return {k: int(mem.end_breakdown[k]) for k in ("params", "grads", "optimizer")}, model


_MEASURE_REFERENCES = (
    "course_lib.models:count_params",
    "course_lib.measure.memory:MemoryMeter",
    *_STATE_REFERENCES,
    "course_lib.measure.estimate.training:gpt_param_count",
)


def check_predict_measured_state(predict_state, task: int = 4) -> None:
    """Task (predict, then measure): the params, grads and optimizer bytes MemoryMeter reports
    after one Adam step of a GPT the learner has not seen, residuals included (exact: 0 B)."""
    for config in _unseen_gpts():
        measured, model = _measure_gpt_state(config)
        got = run_learner(task, predict_state, model, forbid=_MEASURE_REFERENCES)
        if not isinstance(got, dict) or any(k not in got for k in measured):
            fail(task, f"expected a dict with keys {list(measured)}, got {got!r}")
        for key, value in measured.items():
            expect_int(task, f"{key} (bytes)", got[key])
            if got[key] != value:
                n = sum(p.numel() for p in model.parameters())
                hint = ""
                if key == "params" and got[key] == 4 * n:
                    hint = " (the meter files the model's buffers under params too)"
                elif key == "optimizer" and got[key] == 8 * n:
                    hint = " (Adam also keeps a 'step' counter per parameter tensor)"
                fail(
                    task,
                    f"GPT n_layer={config.n_layer} n_embd={config.n_embd} bias={config.bias} "
                    f"tie_weights={config.tie_weights}: {key}: expected {fmt_int(value)} B "
                    f"(measured), got {got[key]!r}{hint}",
                )
    passed(
        task,
        "params, grads and optimizer bytes match MemoryMeter exactly (0 B tolerance) on 3 unseen GPTs",
    )


# ---------------------------------------------------------------------------------- task 5
#: the one right diagnosis of the buggy weight_bytes in solutions/00_start_here.ipynb
BUG_CHOICES = {
    "a": "it multiplies by the wrong element size",
    "b": "state_dict() lists a tied weight once per name and also holds buffers, so it overcounts",
    "c": "it leaves out frozen parameters",
    "d": "it counts the gradients as well as the weights",
}


def check_weight_bytes_bug(bug: str, weight_bytes, task: int = 5) -> None:
    """Task (find the bug): name what is wrong with a state_dict-based byte count, and fix it."""
    import torch
    from torch import nn

    if not isinstance(bug, str) or bug.strip().lower() not in BUG_CHOICES:
        fail(task, f"bug must be one of {sorted(BUG_CHOICES)}, got {bug!r}")
    if bug.strip().lower() != "b":
        fail(
            task,
            f"bug {bug!r} ({BUG_CHOICES[bug.strip().lower()]}): that is not what goes wrong; "
            "compare the buggy count with sum(p.numel() for p in model.parameters())",
        )
    models = _unseen_models()

    class TiedWithBuffer(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(20, 6)
            self.head = nn.Linear(6, 20, bias=False)
            self.head.weight = self.embed.weight
            self.register_buffer("positions", torch.arange(16))

    models["tied_with_buffer"] = TiedWithBuffer()
    for name, model in models.items():
        for dtype in (torch.float32, torch.bfloat16):
            converted = copy.deepcopy(model).to(dtype)
            expected = sum(p.numel() * p.element_size() for p in converted.parameters())
            got = run_learner(task, weight_bytes, model, dtype, forbid=_COUNT_REFERENCES)
            expect_int(task, f"the weight bytes of '{name}'", got)
            if got != expected:
                fail(task, f"model '{name}', {dtype}: expected {fmt_int(expected)} B, got {got!r}")
    passed(task, "bug named (state_dict overcounts) and the fixed count matches on 5 models")
