"""Unit 07's graded checks: a right answer passes, a wrong one fails, the course's own is refused."""

from __future__ import annotations

import math

import pytest
import torch
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


def test_count(capsys):
    C.check_count_lora(count_right)
    assert capsys.readouterr().out.startswith("✓ task 1: Mistral-7B")
    with pytest.raises(
        AssertionError, match="✗ task 1: .*expected 2,621,440, got 2,818,048 .*key/value heads"
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
        self.base.weight += self.lora_B @ self.lora_A * self.scaling
        self.merged = True


class NoScaling(GoodLoRA):
    def forward(self, x):
        return self.base(x) + x @ self.lora_A.T @ self.lora_B.T


class MergeTwice(GoodLoRA):
    @torch.no_grad()
    def merge(self):
        self.base.weight += self.lora_B @ self.lora_A * self.scaling  # but forward still adds it


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


def test_forward(capsys):
    C.check_lora_forward(GoodLoRA)
    assert capsys.readouterr().out.startswith("✓ task 2:")
    with pytest.raises(AssertionError, match="✗ task 2: output for input shape .* max abs error"):
        C.check_lora_forward(NoScaling)
    with pytest.raises(AssertionError, match="✗ task 2: uses the course's own LoRALinear"):
        C.check_lora_forward(CourseLoRA)


def test_merge(capsys):
    C.check_lora_merge(GoodLoRA)
    assert capsys.readouterr().out.startswith("✓ task 3:")
    with pytest.raises(
        AssertionError, match="✗ task 3: after merge\\(\\) the update is added twice"
    ):
        C.check_lora_merge(MergeTwice)
    with pytest.raises(AssertionError, match="✗ task 3: uses the course's own LoRALinear"):
        C.check_lora_merge(CourseLoRA)


def test_init_adapter(capsys):
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
