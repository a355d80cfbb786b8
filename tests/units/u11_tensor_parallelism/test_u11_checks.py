"""Unit 11's graded checks: a correct answer passes, a wrong one fails with a ✗ line, one that
calls the course's own answer is refused."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from course_lib.units.u11_tensor_parallelism import checks as C


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


def test_check_row_parallel():
    C.check_row_parallel(good_row)
    with pytest.raises(AssertionError, match=r"✗ task 1: rank \d of 2: the output differs"):
        C.check_row_parallel(bias_inside_row)
    with pytest.raises(
        AssertionError, match="✗ task 1: uses the course's own ReduceFromTensorParallelRegion"
    ):
        C.check_row_parallel(course_row)


def test_check_allreduce_count():
    C.check_allreduce_count(128)
    with pytest.raises(AssertionError, match=r"✗ task 2: you said 64 all-reduces \(2 per layer\)"):
        C.check_allreduce_count(64)  # the sources' count
    with pytest.raises(AssertionError, match="✗ task 2: the number of all-reduces must be an int"):
        C.check_allreduce_count(128.0)


def fixed_mlp(x, c_fc, c_proj, group):
    h = F.gelu(c_fc(_SumBackward.apply(x, group)))
    return _SumForward.apply(c_proj(h), group)


def buggy_mlp(x, c_fc, c_proj, group):  # the exercise's bug: f and g swapped
    h = F.gelu(c_fc(_SumForward.apply(x, group)))
    return _SumBackward.apply(c_proj(h), group)


def course_mlp(x, c_fc, c_proj, group):
    from course_lib.parallel.tensor import f, g

    return g.apply(c_proj(F.gelu(c_fc(f.apply(x, group)))), group)


def test_check_fixed_mlp():
    C.check_fixed_mlp(fixed_mlp)
    with pytest.raises(AssertionError, match=r"✗ task 3: rank \d of 2: the output differs"):
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
