"""Unit 11's graded checks: a correct answer passes, a wrong one fails with a ✗ line, one that
calls the course's own answer is refused; under two grading seeds, and a constant copied from
the lecture or from seed 0's case fails under another."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from _grading_seeds import FIXTURE_SEEDS  # seed 0: tests/_grading_seeds.py

from course_lib.units.u11_tensor_parallelism import checks as C

SEEDS = ("0", "7")


@pytest.fixture(params=FIXTURE_SEEDS)
def seed(request, monkeypatch):
    monkeypatch.setenv("COURSE_GRADE_SEED", request.param)
    return request.param


class _SumForward(torch.autograd.Function):  # all-reduce forward, identity backward
    @staticmethod
    def forward(ctx, x, group):
        out = x.clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _SumBackward(torch.autograd.Function):  # identity forward, all-reduce backward
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


def good_row(x_shard, weight_shard, bias, group):
    return _SumForward.apply(x_shard @ weight_shard.t(), group) + bias


def bias_inside_row(x_shard, weight_shard, bias, group):  # the bias summed t times
    return _SumForward.apply(x_shard @ weight_shard.t() + bias, group)


def course_row(x_shard, weight_shard, bias, group):
    from course_lib.parallel.tensor import g

    return g.apply(x_shard @ weight_shard.t(), group) + bias


def test_check_row_parallel(seed):
    C.check_row_parallel(good_row)
    case = C.linear_case(1)
    with pytest.raises(
        AssertionError,
        match=rf"✗ task 1: rank \d of 2 \(nn.Linear\({case['in']}, {case['out']}\), "
        rf"{case['rows']} rows\): the output differs",
    ):
        C.check_row_parallel(bias_inside_row)
    with pytest.raises(
        AssertionError, match="✗ task 1: uses the course's own ReduceFromTensorParallelRegion"
    ):
        C.check_row_parallel(course_row)


def good_count(n_layer, microbatches):
    return 4 * n_layer * microbatches


def test_check_allreduce_count(seed):
    C.check_allreduce_count(good_count)
    n, k = C.count_case(2)["n_layer"], C.count_case(2)["microbatches"]
    with pytest.raises(
        AssertionError,
        match=rf"✗ task 2: you said {4 * n} all-reduces for {n} layers and {k} micro-batches "
        r".*made more in one step",
    ):
        C.check_allreduce_count(lambda n_layer, m: 4 * n_layer)  # forgets the micro-batches
    with pytest.raises(
        AssertionError, match="✗ task 2: the number of all-reduces .* must be an int"
    ):
        C.check_allreduce_count(lambda n_layer, m: float(good_count(n_layer, m)))
    with pytest.raises(AssertionError, match="✗ task 2: uses the course's own .*source_check"):
        C.check_allreduce_count(course_count)


def course_count(n_layer, microbatches):
    from course_lib.units.u11_tensor_parallelism.run_scale import source_check

    return source_check(n_layer)["allreduces_per_step"] * microbatches


def test_the_lecture_constant_or_a_copied_count_fails(monkeypatch):
    case = C.count_case(2)  # seed 0's, built here
    copied = good_count(case["n_layer"], case["microbatches"])
    C.check_allreduce_count(lambda n, k: copied)
    for s in SEEDS:
        monkeypatch.setenv("COURSE_GRADE_SEED", s)
        with pytest.raises(AssertionError, match="✗ task 2: you said 128 all-reduces"):
            C.check_allreduce_count(lambda n, k: 128)  # the lecture's 4 x 32
    monkeypatch.setenv("COURSE_GRADE_SEED", "7")
    assert C.count_case(2) != case
    with pytest.raises(AssertionError, match=f"✗ task 2: you said {copied} all-reduces"):
        C.check_allreduce_count(lambda n, k: copied)


def fixed_mlp(x, c_fc, c_proj, group):
    h = F.gelu(c_fc(_SumBackward.apply(x, group)))
    return _SumForward.apply(c_proj(h), group)


def buggy_mlp(x, c_fc, c_proj, group):  # the exercise's bug: f and g swapped
    h = F.gelu(c_fc(_SumForward.apply(x, group)))
    return _SumBackward.apply(c_proj(h), group)


def course_mlp(x, c_fc, c_proj, group):
    from course_lib.parallel.tensor import f, g

    return g.apply(c_proj(F.gelu(c_fc(f.apply(x, group)))), group)


def test_check_fixed_mlp(seed):
    C.check_fixed_mlp(fixed_mlp)
    width = C.mlp_case(3)["width"]
    with pytest.raises(
        AssertionError,
        match=rf"✗ task 3: rank \d of 2 \(MLP of width {width}\): the output differs",
    ):
        C.check_fixed_mlp(buggy_mlp)
    with pytest.raises(AssertionError, match="✗ task 3: uses the course's own"):
        C.check_fixed_mlp(course_mlp)


def test_not_implemented_and_not_callable():
    def stub(*args):
        raise NotImplementedError("FILL ME IN")

    with pytest.raises(AssertionError, match="✗ task 1: not implemented yet"):
        C.check_row_parallel(stub)
    with pytest.raises(AssertionError, match="✗ task 3: expected a function"):
        C.check_fixed_mlp(3)
