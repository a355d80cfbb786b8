"""Unit 07's graded checks: a right answer passes, a wrong one fails, the course's own is refused,
under two grading seeds; a table of the default seed's answers fails under another."""

from __future__ import annotations

import math

import pytest
import torch
from _grading_seeds import copied_fails, seed_fixture  # noqa: F401 (the seed fixture)
from torch import nn

from course_lib.units.u07_lora_qlora import checks as C


def count_right(r):
    h, kv, f = 4096, 1024, 14336
    return r * 32 * (2 * (h + h) + 2 * (h + kv) + 3 * (h + f))


def count_no_gqa(r):
    return r * 32 * (4 * (4096 + 4096) + 3 * (4096 + 14336))


def count_course(r):
    from course_lib.measure import estimate

    return estimate.transformer_lora_params(
        hidden=4096, ffn=14336, layers=32, r=r, targets="all", kv_hidden=1024
    )


def test_count(capsys, seed):
    C.check_count_lora(count_right)
    assert capsys.readouterr().out.startswith("✓ task 1: Mistral-7B")
    with pytest.raises(
        AssertionError,
        match="✗ task 1: count_lora_params\\(1\\): 2,818,048 is not .*key/value heads",
    ):
        C.check_count_lora(count_no_gqa)
    with pytest.raises(AssertionError, match="✗ task 1: .*expected an int"):
        C.check_count_lora(lambda r: float(count_right(r)))
    with pytest.raises(AssertionError, match="✗ task 1: uses the course's own"):
        C.check_count_lora(count_course)


class GoodLoRA(nn.Module):
    def __init__(self, base, *, r, alpha):
        super().__init__()
        self.base, self.scaling, self.merged = base, alpha / r, False
        for p in base.parameters():
            p.requires_grad_(False)
        self.lora_A = nn.Parameter(torch.empty(r, base.in_features))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, r))

    def forward(self, x):
        y = self.base(x)
        return y if self.merged else y + (x @ self.lora_A.T @ self.lora_B.T) * self.scaling

    @torch.no_grad()
    def merge(self):
        delta = self.lora_B @ self.lora_A * self.scaling
        self.base.weight += delta if isinstance(self.base, nn.Linear) else delta.T
        self.merged = True


class LinearMergeOnly(GoodLoRA):
    """The lecture's merge, written for nn.Linear's layout only."""

    @torch.no_grad()
    def merge(self):
        self.base.weight += (self.lora_B @ self.lora_A * self.scaling).reshape(
            self.base.weight.shape
        )
        self.merged = True


class NoScaling(GoodLoRA):
    def forward(self, x):
        return self.base(x) + x @ self.lora_A.T @ self.lora_B.T


class MergeTwice(GoodLoRA):
    @torch.no_grad()
    def merge(self):
        delta = self.lora_B @ self.lora_A * self.scaling  # but forward still adds it
        self.base.weight += delta if isinstance(self.base, nn.Linear) else delta.T


class CourseLoRA(nn.Module):
    def __init__(self, base, *, r, alpha):
        from course_lib.techniques.lora import LoRALinear

        super().__init__()
        self.inner = LoRALinear(base, r=r, alpha=alpha)
        self.base, self.lora_A, self.lora_B = base, self.inner.lora_A, self.inner.lora_B
        self.scaling, self.merged = self.inner.scaling, False

    def forward(self, x):
        return self.inner(x)

    def merge(self):
        self.inner.merge()


def test_forward(capsys, seed):
    C.check_lora_forward(GoodLoRA)
    assert capsys.readouterr().out.strip() == (
        "✓ task 2: forward on a GPT-2 Conv1D base: unchanged at step 0, base(x) + (alpha / r) B A x "
        "once B is trained, base frozen (rtol=1e-05, atol=1e-06)"
    )
    with pytest.raises(
        AssertionError, match="✗ task 2: Conv1D base, output for input shape .* max abs error"
    ):
        C.check_lora_forward(NoScaling)
    with pytest.raises(AssertionError, match="✗ task 2: uses the course's own LoRALinear"):
        C.check_lora_forward(CourseLoRA)


def test_merge(capsys, seed):
    C.check_lora_merge(GoodLoRA)
    assert capsys.readouterr().out.strip() == (
        "✓ task 3: merge() folds (alpha / r) B A into W0 of an nn.Linear and of a GPT-2 Conv1D "
        "(stored transposed) and the output is unchanged (rtol=1e-05, atol=1e-06)"
    )
    with pytest.raises(
        AssertionError, match="✗ task 3: Linear base: after merge\\(\\) the update is added twice"
    ):
        C.check_lora_merge(MergeTwice)
    with pytest.raises(AssertionError, match="✗ task 3: Conv1D base: base.weight after merge"):
        C.check_lora_merge(LinearMergeOnly)
    with pytest.raises(AssertionError, match="✗ task 3: uses the course's own LoRALinear"):
        C.check_lora_merge(CourseLoRA)


def test_init_adapter(capsys, seed):
    C.check_init_adapter(
        lambda d_in, d_out, r: (torch.randn(r, d_in) / d_in**0.5, torch.zeros(d_out, r))
    )
    assert capsys.readouterr().out.startswith("✓ task 4:")
    with pytest.raises(
        AssertionError, match="✗ task 4: the adapted layer changes the pre-trained output"
    ):
        C.check_init_adapter(lambda d_in, d_out, r: (torch.randn(r, d_in), torch.randn(d_out, r)))
    with pytest.raises(AssertionError, match="✗ task 4: after one SGD step"):
        C.check_init_adapter(lambda d_in, d_out, r: (torch.zeros(r, d_in), torch.zeros(d_out, r)))

    def course(d_in, d_out, r):
        from course_lib.techniques.lora import LoRALinear

        layer = LoRALinear(nn.Linear(d_in, d_out), r=r, alpha=1)
        return layer.lora_A.detach(), layer.lora_B.detach()

    with pytest.raises(AssertionError, match="✗ task 4: uses the course's own LoRALinear"):
        C.check_init_adapter(course)


def test_copied_answers_fail_under_another_seed(monkeypatch):
    copied_fails(monkeypatch, C.check_count_lora, count_right, task=1)


def test_the_conv1d_base_is_one_class():
    assert C.Conv1D is C.Conv1D
    layer = C.Conv1D(5, 3)
    assert tuple(layer.weight.shape) == (5, 3) and tuple(layer(torch.ones(2, 5)).shape) == (2, 3)
