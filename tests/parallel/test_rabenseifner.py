"""Rabenseifner's all-reduce (recursive halving + recursive doubling) against dist.all_reduce and
against its byte and step counts, on 2 and 4 real gloo ranks (3 ranks: it refuses)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist

import course_lib
from course_lib.parallel import collectives as C


def _worker(rank: int, world_size: int) -> dict:
    from course_lib.measure.comm import CommMeter

    out = {"cases": []}
    for numel in (1, 7, 1001, 4 * 1024):
        gen = torch.Generator().manual_seed(31 * rank + numel)
        x = torch.randn(numel, generator=gen, dtype=torch.float64)  # (S,)
        ref, abs_sum = x.clone(), x.abs()
        dist.all_reduce(ref)
        dist.all_reduce(abs_sum)
        got = x.clone()
        C.rabenseifner_all_reduce(got)
        bound = 2 * (world_size - 1) * torch.finfo(torch.float64).eps * abs_sum
        same = [torch.empty_like(got) for _ in range(world_size)]
        dist.all_gather(same, got)
        out["cases"].append(
            {
                "numel": numel,
                "within_bound": bool(((got - ref).abs() <= bound).all()),
                "identical_on_every_rank": all(torch.equal(s, got) for s in same),
            }
        )
    x = torch.ones(world_size * 1024)  # float32, divisible by N
    with CommMeter(dispatch=False) as meter:
        C.rabenseifner_all_reduce(x)
    out["bytes_sent"] = int(meter.model_bytes_sent)
    out["sends"] = sum(n for op, n in meter.calls.items() if "send" in op)
    out["value"] = float(x[0])
    x2d = torch.arange(12.0).reshape(3, 4).t()  # non-contiguous
    C.rabenseifner_all_reduce(x2d)
    out["non_contiguous_ok"] = bool(
        torch.equal(x2d, world_size * torch.arange(12.0).reshape(3, 4).t())
    )
    return out


@pytest.mark.parametrize("world_size", [2, 4])
def test_rabenseifner_matches_all_reduce_with_ring_bytes_in_2_log2_n_steps(world_size):
    results = course_lib.launch(_worker, world_size, timeout=60)
    size = world_size * 1024 * 4
    for rank, res in enumerate(results):
        for case in res["cases"]:
            assert case["within_bound"] and case["identical_on_every_rank"], (rank, case)
        assert res["bytes_sent"] == 2 * (world_size - 1) * size // world_size  # the ring's bytes
        assert res["sends"] == 2 * int(math.log2(world_size))  # ring: 2(N-1)
        assert res["value"] == world_size and res["non_contiguous_ok"]


def _three(rank, world_size):
    try:
        C.rabenseifner_all_reduce(torch.ones(4))
    except ValueError as err:
        return str(err)
    return None


def test_rabenseifner_refuses_a_world_size_that_is_not_a_power_of_two():
    msgs = course_lib.launch(_three, 3, timeout=60)
    assert all(
        m and m.startswith("world_size = 3: expected a power of two (1, 2, 4, 8, ...)")
        for m in msgs
    )
