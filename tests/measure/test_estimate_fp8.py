"""FP8 formulas (course_lib.measure.estimate.fp8), each against a hand count or torch itself."""

from __future__ import annotations

import pytest
import torch

from course_lib.measure import estimate


def test_formats_match_torch_and_table1():
    for name, dtype in (("e4m3", torch.float8_e4m3fn), ("e5m2", torch.float8_e5m2)):
        f, fi = estimate.fp8_format(name), torch.finfo(dtype)
        assert f.max_normal == float(fi.max) and f.min_normal == float(fi.smallest_normal)
        assert f.epsilon == float(fi.eps)
        assert f.min_subnormal == float(torch.tensor([1], dtype=torch.uint8).view(dtype).float())
    assert estimate.fp8_format("e4m3").max_normal == 448.0
    assert estimate.fp8_format("e5m2").max_normal == 57344.0


def test_scale_count_and_cast_bytes():
    assert estimate.fp8_scale_count(256, 512, scaling="tensorwise") == 1
    assert estimate.fp8_scale_count(256, 512, scaling="rowwise") == 256
    assert estimate.fp8_scale_count(256, 512, scaling="blockwise") == 256 * 4
    assert estimate.fp8_scale_count(256, 512, scaling="blockwise", block_rows=128) == 2 * 4
    # DeepSeek-V3's dispatch: one token of width 7168 with 1 x 128 tiles
    assert estimate.fp8_cast_bytes(1, 7168, scaling="blockwise") == 7168 + 4 * 56
    with pytest.raises(ValueError, match=r"^block = 128, block_rows = 1: expected them to divide"):
        estimate.fp8_scale_count(4, 100, scaling="blockwise")


def test_fsdp_allgather_bytes():
    # 2 passes x (N-1)/N x bytes: FP8 halves bf16 on the linear weights
    f = estimate.fsdp_allgather_bytes_sent
    assert f(linear_params=1000, other_params=0, world_size=4, gather="bf16") == 3000
    assert f(linear_params=1000, other_params=0, world_size=4, gather="fp8") == 1500
    assert f(linear_params=1000, other_params=8, world_size=4, gather="fp8") == 1500 + 24
    assert f(linear_params=1000, other_params=8, world_size=4, gather="fp32") == 6048
    assert f(linear_params=1000, other_params=0, world_size=4, reshard_after_forward=False) == 750
    with pytest.raises(ValueError, match=r"^gather = 'int8': expected one of fp32, bf16, fp8"):
        f(linear_params=1, other_params=1, world_size=2, gather="int8")


def test_fsdp_memory_and_speedup():
    m = estimate.fsdp_fp8_memory_per_gpu(1000, 8, largest_layer_params=100)
    assert m == {"sharded": 2000, "gathered": 100, "total": 2100}
    assert (
        estimate.fsdp_fp8_memory_per_gpu(1000, 8, largest_layer_params=100, gather="bf16")[
            "gathered"
        ]
        == 200
    )
    assert estimate.fp8_step_speedup(1.0) == 2.0
    assert estimate.fp8_step_speedup(0.5) == pytest.approx(1 / 0.75)
    assert estimate.fp8_step_speedup(0.0, overhead=0.25) == 0.8
    with pytest.raises(ValueError, match=r"^fraction = 1.5: expected a number <= 1.0"):
        estimate.fp8_step_speedup(1.5)


def test_linear_flops_fraction_by_hand():
    # h = 4, f = 16, k = h, s = 8, 1 layer, no head: linear 6 (2*16 + 2*16 + 3*64) = 1536,
    # attention 12 * 8 * 4 = 384
    got = estimate.linear_flops_fraction(layers=1, hidden=4, seq=8, ffn=16, heads=2)
    assert got == pytest.approx(1536 / (1536 + 384))
    big = estimate.linear_flops_fraction(
        layers=80, hidden=8192, seq=8192, ffn=28672, heads=64, kv_heads=8, vocab=128256
    )
    assert 0.8 < big < 0.95
