"""Unit 19's graded checks: a correct answer passes, a wrong one fails with a ✗ line that says
what is wrong, one that calls the course's own answer is refused."""

from __future__ import annotations

import math

import pytest
import torch
from _grading_seeds import FIXTURE_SEEDS  # seed 0: tests/_grading_seeds.py
from _rewritten import rewritten

from course_lib import kit
from course_lib.units.u19_inside_the_step import checks as C


@pytest.fixture(params=FIXTURE_SEEDS)
def seed(request, monkeypatch):
    monkeypatch.setenv("COURSE_GRADE_SEED", request.param)
    return request.param


# ---- task 1 --------------------------------------------------------------------------------
def good_roofline(ops, flops_per_s, bytes_per_s):
    out = []
    for op in ops:
        b = op["bytes_per_value"]
        if op["kind"] == "matmul":
            m, k, n = op["m"], op["k"], op["n"]
            flops, nbytes = 2 * m * k * n, (m * k + k * n + m * n) * b
        else:
            flops = op["numel"] * op["flops_per_element"]
            nbytes = op["numel"] * (op["inputs"] + op["outputs"]) * b
        ridge = flops_per_s / bytes_per_s
        bound = "memory" if flops / nbytes < ridge else "compute"
        out.append((bound, max(flops / flops_per_s, nbytes / bytes_per_s)))
    return out


def test_check_roofline(seed):
    def matmuls_always_compute(ops, f, b):
        return [("compute" if op["kind"] == "matmul" else r[0], r[1])
                for op, r in zip(ops, good_roofline(ops, f, b))]  # fmt: skip

    def compute_time_only(ops, f, b):  # forgets the memory roof
        return [(bound, t) for bound, t in good_roofline(ops, f * 1e9, b)]

    def course(ops, f, b):
        from course_lib.units.u19_inside_the_step.run_roofline import roofline

        return roofline(ops, f, b)

    rewritten_course = rewritten("course_lib.units.u19_inside_the_step.run_roofline").roofline
    kit.check_table(
        C.check_roofline,
        [
            (good_roofline, "✓ task 1: memory- or compute-bound"),
            (rewritten_course, "✓ task 1: memory- or compute-bound"),
            (matmuls_always_compute, r"✗ task 1: .*kind=matmul.*you said 'compute'"),
            (compute_time_only, "✗ task 1: "),
            (course, "✗ task 1: uses the course's own roofline"),
        ],
    )


def test_roofline_cases_hold_both_bounds_on_every_machine(seed):
    for name, peak, bw, ops in C.roofline_cases(1):
        bounds = {bound for bound, _ in good_roofline(ops, peak, bw)}
        assert bounds == {"memory", "compute"}, (name, bounds)


# ---- task 2 --------------------------------------------------------------------------------
def good_merge_backward(out_a, lse_a, out_b, lse_b, dout, dlse):
    lse = torch.logaddexp(lse_a, lse_b)
    wa, wb = torch.exp(lse_a - lse), torch.exp(lse_b - lse)
    out = out_a * wa[..., None] + out_b * wb[..., None]
    d_lse_a = wa * ((dout * (out_a - out)).sum(-1) + dlse)
    d_lse_b = wb * ((dout * (out_b - out)).sum(-1) + dlse)
    return dout * wa[..., None], d_lse_a, dout * wb[..., None], d_lse_b


def test_check_merge_backward(seed):
    def no_lse_path(out_a, lse_a, out_b, lse_b, dout, dlse):  # forgets that lse moves the weights
        g = good_merge_backward(out_a, lse_a, out_b, lse_b, dout, dlse)
        wa = torch.exp(lse_a - torch.logaddexp(lse_a, lse_b))
        return g[0], wa * dlse, g[2], g[3]

    def course(out_a, lse_a, out_b, lse_b, dout, dlse):
        from course_lib.parallel.context.blocks import merge_attention

        leaves = [t.detach().requires_grad_() for t in (out_a, lse_a, out_b, lse_b)]
        return torch.autograd.grad(merge_attention(*leaves), leaves, (dout, dlse))

    kit.check_table(
        C.check_merge_backward,
        [
            (good_merge_backward, "✓ task 2: your merge backward"),
            (no_lse_path, r"✗ task 2: case \d: d_lse_a differs"),
            (course, "✗ task 2: uses the course's own merge_attention"),
        ],
    )


# ---- task 3 --------------------------------------------------------------------------------
def tiled(q, k, v, block_size, *, rescale=True):
    n, d = q.shape[2], q.shape[3]
    out = torch.empty_like(q)
    for i in range(0, n, block_size):
        qi = q[:, :, i : i + block_size]
        m = torch.full(qi.shape[:-1], -math.inf, dtype=q.dtype)
        l = torch.zeros(qi.shape[:-1], dtype=q.dtype)  # noqa: E741
        acc = torch.zeros_like(qi)
        for j in range(0, k.shape[2], block_size):
            s = qi @ k[:, :, j : j + block_size].transpose(-2, -1) / math.sqrt(d)
            m_new = torch.maximum(m, s.amax(-1))
            p = torch.exp(s - m_new[..., None])
            alpha = torch.exp(m - m_new)
            l = l * alpha + p.sum(-1)  # noqa: E741
            acc = (acc * alpha[..., None] if rescale else acc) + p @ v[:, :, j : j + block_size]
            m = m_new
        out[:, :, i : i + block_size] = acc / l[..., None]
    return out


def test_check_fixed_tiled(seed, capsys):
    C.check_fixed_tiled(tiled)
    assert capsys.readouterr().out.startswith("✓ task 3: your tiled attention")
    with pytest.raises(
        AssertionError, match="✗ task 3: right when each row's largest score is in the first"
    ):
        C.check_fixed_tiled(lambda q, k, v, b: tiled(q, k, v, b, rescale=False))
    with pytest.raises(AssertionError, match="✗ task 3: .* not tiled: aten.bmm made a"):
        C.check_fixed_tiled(
            lambda q, k, v, b: (
                torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), -1) @ v
            )
        )
    sdpa = torch.nn.functional.scaled_dot_product_attention
    with pytest.raises(AssertionError, match="✗ task 3: .* not tiled: aten._scaled_dot_product"):
        C.check_fixed_tiled(lambda q, k, v, b: sdpa(q, k, v))

    def course(q, k, v, b):
        from course_lib.techniques.flash import flash_attention

        return flash_attention(q, k, v, block_size=b)

    with pytest.raises(AssertionError, match="✗ task 3: uses the course's own"):
        C.check_fixed_tiled(course)
