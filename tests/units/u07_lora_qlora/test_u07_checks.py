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


class GoodQV(nn.Module):
    def __init__(self, c_attn, *, r, alpha):
        super().__init__()
        self.base, self.scaling = c_attn, alpha / r
        for p in c_attn.parameters():
            p.requires_grad_(False)
        d_in, d = c_attn.in_features, c_attn.out_features // 3
        self.A_q = nn.Parameter(torch.randn(r, d_in) / d_in**0.5)
        self.A_v = nn.Parameter(torch.randn(r, d_in) / d_in**0.5)
        self.B_q = nn.Parameter(torch.zeros(d, r))
        self.B_v = nn.Parameter(torch.zeros(d, r))

    def update(self, x, name):
        A, B = getattr(self, f"A_{name}"), getattr(self, f"B_{name}")
        return (x @ A.T @ B.T) * self.scaling

    def forward(self, x):
        q, k, v = self.base(x).split(self.base.out_features // 3, dim=-1)
        return torch.cat([q + self.update(x, "q"), k, v + self.update(x, "v")], dim=-1)


class QVLectureForward(GoodQV):
    """The lecture's forward, one update over the whole output (q's pair stands in)."""

    def forward(self, x):
        d = self.base.out_features // 3
        return self.base(x) + self.update(x, "q").repeat_interleave(3, dim=-1)[..., : 3 * d]


class QVAlsoK(GoodQV):
    def forward(self, x):
        q, k, v = self.base(x).split(self.base.out_features // 3, dim=-1)
        u, w = self.update(x, "q"), self.update(x, "v")
        return torch.cat([q + u, k + w, v + w], dim=-1)


class QVSwapped(GoodQV):
    def forward(self, x):
        q, k, v = self.base(x).split(self.base.out_features // 3, dim=-1)
        return torch.cat([q + self.update(x, "v"), k, v + self.update(x, "q")], dim=-1)


class QVNoScaling(GoodQV):
    def update(self, x, name):
        return super().update(x, name) / self.scaling


class QVDetached(GoodQV):
    def update(self, x, name):
        return super().update(x, name).detach()


class CourseQV(GoodQV):
    """The course's LoRALinear around nn.Linear views of the q and v columns."""

    def update(self, x, name):
        from course_lib.techniques.lora import LoRALinear

        d = self.base.out_features // 3
        cols = slice(0, d) if name == "q" else slice(2 * d, 3 * d)
        lin = nn.Linear(self.base.in_features, d, bias=False)
        lin.weight.data = self.base.weight.data[:, cols].T
        inner = LoRALinear(lin, r=self.A_q.shape[0], alpha=self.scaling * self.A_q.shape[0])
        inner.lora_A, inner.lora_B = getattr(self, f"A_{name}"), getattr(self, f"B_{name}")
        return inner(x) - lin(x)


def test_qv_forward(capsys, seed):
    C.check_qv_forward(GoodQV)
    assert capsys.readouterr().out.strip() == (
        "✓ task 2: LoRA on q and v of GPT-2's fused c_attn: unchanged at step 0, q and v updated "
        "by (alpha / r) B A x once B is trained, k the base's, base frozen (rtol=1e-05, "
        "atol=1e-05 of the largest value)"
    )
    with pytest.raises(AssertionError, match="✗ task 2: .*the k part of the output"):
        C.check_qv_forward(QVLectureForward)
    with pytest.raises(AssertionError, match="✗ task 2: .*the k part of the output"):
        C.check_qv_forward(QVAlsoK)
    with pytest.raises(AssertionError, match="✗ task 2: .*the q part of the output"):
        C.check_qv_forward(QVSwapped)
    with pytest.raises(AssertionError, match="✗ task 2: .*the q part .*alpha / r = "):
        C.check_qv_forward(QVNoScaling)
    with pytest.raises(AssertionError, match="✗ task 2: A_q, B_q, A_v, B_v got no gradient"):
        C.check_qv_forward(QVDetached)
    with pytest.raises(AssertionError, match="✗ task 2: uses the course's own LoRALinear"):
        C.check_qv_forward(CourseQV)


def test_the_lectures_single_adapter_does_not_fit_the_fused_layer(seed):
    """Copying the lecture's LoRALinear (lora_A and lora_B over the whole layer) is refused by
    name: the q/v adapter has no such attributes."""
    with pytest.raises(
        AssertionError, match="✗ task 2: GoodLoRA\\(Conv1D\\(.*\\.A_q: expected a tensor"
    ):
        C.check_qv_forward(GoodLoRA)


def test_merge(capsys, seed):
    C.check_lora_merge(GoodLoRA)
    assert capsys.readouterr().out.strip() == (
        "✓ task 3: merge() folds (alpha / r) B A into W0 of an nn.Linear and of a GPT-2 Conv1D "
        "(stored transposed) and the output is unchanged (rtol=1e-05, atol=1e-05 of the largest "
        "value)"
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
