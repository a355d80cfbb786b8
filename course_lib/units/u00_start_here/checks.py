"""Checks for the warm-up exercise of unit 00 (solutions/00_start_here.ipynb).

Each check runs the learner's function on models the learner has not seen and compares it with
what torch itself reports. It prints one deterministic line or raises AssertionError.
"""
from __future__ import annotations

import copy

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
_STATE_REFERENCES = ("course_lib.measure.estimate.memory:model_state_bytes", "course_lib.measure.estimate.memory:optimizer_state_bytes_per_param")


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
            fail(task, f"model '{name}': expected {fmt_int(expected)} parameters, got {got!r}{hint}")
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

    for n_params in (1, 1_000, 124_439_808, 7_000_000_000):
        expected = estimate.model_state_bytes(n_params, precision="fp32", optimizer="adam")["total"]
        got = run_learner(task, adam_training_bytes, n_params, forbid=_STATE_REFERENCES)
        expect_int(task, f"the bytes for n_params={fmt_int(n_params)}", got)
        if got != expected:
            fail(task, f"n_params={fmt_int(n_params)}: expected {fmt_int(expected)} B, got {got!r}")
    passed(task, f"Adam fp32 model state matches estimate (7B parameters -> {fmt_int(expected)} B)")
