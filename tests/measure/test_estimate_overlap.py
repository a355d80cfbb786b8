"""estimate.*_overlap_*, pp_*: when each parallelism's communication hides, by hand.

F/B below is FLOPs per byte: an H100's 989e12 bf16 FLOP/s over 450e9 B/s (NVLink, per
direction) = 2,197.78, over 50e9 B/s (one InfiniBand NDR port) = 19,780."""

from __future__ import annotations

import math

import pytest

from course_lib.measure import estimate as E

H100 = E.gpu_spec("H100").peak_flops  # 989e12
NVLINK = E.link_speed("NVLink H100").per_direction_GBps  # 450
IB = E.link_speed("InfiniBand NDR").per_direction_GBps  # 50
ON_IB = dict(peak_flops=H100, link_GBps=IB)
ON_NVLINK = dict(peak_flops=H100, link_GBps=NVLINK)


def test_dp_tokens():
    # backward 4 N' T / F against the ring's 2 (N-1)/N N' g / B: T = (F/B) (N-1)/N g/2
    assert E.dp_overlap_min_tokens(world_size=8, **ON_IB) == pytest.approx(19780 * 7 / 8)
    assert E.dp_overlap_min_tokens(world_size=8, **ON_NVLINK) == pytest.approx(1923.0555, rel=1e-6)
    # fp32 gradients double it, half the achieved FLOP/s halve it, one rank sends nothing
    assert E.dp_overlap_min_tokens(world_size=2, grad_bytes=4, **ON_IB) == pytest.approx(19780)
    assert E.dp_overlap_min_tokens(world_size=2, mfu=0.5, **ON_IB) == pytest.approx(4945)
    assert E.dp_overlap_min_tokens(world_size=1, **ON_IB) == 0


def test_fsdp_tokens():
    # bf16 gather and reduce-scatter: forward p/2 = 1, backward (p+g)/4 = 1: DP's threshold
    assert E.fsdp_overlap_min_tokens(world_size=8, **ON_IB) == pytest.approx(19780 * 7 / 8)
    # FP8 gather: forward 1/2, backward (1+2)/4 = 3/4 binds
    fp8 = E.fsdp_overlap_min_tokens(world_size=4, param_bytes=1, **ON_IB)
    assert fp8 == pytest.approx(19780 * 3 / 4 * 3 / 4)
    # fp32 gather, bf16 gradients: forward 4/2 = 2 binds over backward 6/4
    assert E.fsdp_overlap_min_tokens(world_size=2, param_bytes=4, **ON_IB) == pytest.approx(19780)


def test_tp_hidden():
    # 24 T h^2/(t F) = 4 (t-1) T h p/(t B): h = (F/B) (t-1) p/6
    assert E.tp_overlap_min_hidden(tp=8, **ON_NVLINK) == pytest.approx(2197.7778 * 14 / 6, 1e-6)
    assert E.tp_overlap_min_hidden(tp=8, **ON_IB) == pytest.approx(19780 * 14 / 6)
    assert E.tp_overlap_min_hidden(tp=2, **ON_IB) == pytest.approx(19780 / 3)
    assert E.tp_overlap_min_hidden(tp=1, **ON_IB) == 0
    # latency: t = 2, 1,000 tokens, alpha 10 us, F = 1e12, B = 1e9 (F/B = 1000):
    # 24e3 h^2 / 2e12 = 4 x 1e-5 + 4 x 1e3 x 2 h / 2e9  ->  1.2e-8 h^2 - 4e-6 h - 4e-5 = 0
    h = E.tp_overlap_min_hidden(tp=2, peak_flops=1e12, link_GBps=1, tokens=1000, alpha_s=1e-5)
    root = (4e-6 + math.sqrt(16e-12 + 4 * 1.2e-8 * 4e-5)) / (2 * 1.2e-8)
    assert h == pytest.approx(root) and h > 1000 / 3  # above the bandwidth limit, 333.3
    many = E.tp_overlap_min_hidden(tp=2, peak_flops=1e12, link_GBps=1, tokens=10**9, alpha_s=1e-5)
    assert many == pytest.approx(1000 / 3, rel=1e-4)  # the latency fades with tokens


def test_pp():
    # (p-1)/(m+p-1) < 0.05 at p = 8: m > 7 x 0.95 / 0.05 = 133; v = 2: 2m > 133
    assert E.pp_bubble_micro_batches(8, 0.05) == 134
    assert E.pp_bubble_micro_batches(8, 0.05, virtual_stages=2) == 67
    assert E.pipeline_bubble_fraction(8, 134) < 0.05 <= E.pipeline_bubble_fraction(8, 133)
    # T h p / B over 24 T h^2 L / F: 19,780 x 2 / (24 x 8 x 16,384)
    ratio = E.pp_transfer_to_compute(hidden=16384, layers=8, **ON_IB)
    assert ratio == pytest.approx(39560 / 3145728)
    assert E.pp_transfer_to_compute(hidden=16384, layers=8, **ON_NVLINK) == pytest.approx(ratio / 9)


def test_cp_ring_tokens():
    # 4 n^2 d / F = 2 n d_kv p / B: n = (F/B) d_kv p / (2 d); full MHA in bf16: F/B
    assert E.cp_ring_overlap_min_tokens(heads=32, **ON_IB) == pytest.approx(19780)
    # Llama 3 405B at tp 8: 16 query heads, 1 K/V head a rank: 19,780 / 16
    llama = E.cp_ring_overlap_min_tokens(heads=128, kv_heads=8, tp=8, **ON_IB)
    assert llama == pytest.approx(1236.25)
    assert 8192 // 16 < llama  # Llama 3's 8K-at-cp-16 row: 512 tokens a rank, not hidden
    # kv_heads < tp: one replicated K/V head a rank, 4 query heads: 1/4; causal doubles
    assert E.cp_ring_overlap_min_tokens(
        heads=32, kv_heads=4, tp=8, causal=True, **ON_IB
    ) == pytest.approx(19780 / 4 * 2)
    assert E.cp_ring_overlap_min_tokens(heads=32, **ON_NVLINK) == pytest.approx(2197.7778, 1e-6)


def test_ep_tokens_per_expert():
    # DeepSeek-V3: per row, transfer (F/B) 2 (63/64) h p against 2 P_e = 6 h f FLOPs
    args = dict(hidden=7168, ffn=2048, experts=256, ep=64, gated_mlp=True)
    assert E.ep_overlap_min_tokens_per_expert(alpha_s=9.6e-6, **args, **ON_IB) == math.inf
    # NVLink: margin = 6 h f - 2197.78 x 2 x 63/64 x 2 h = h (12,288 - 8,653.5) FLOPs a row;
    # c = 2 x 63 x alpha x F / margin x 64 / 256
    c = E.ep_overlap_min_tokens_per_expert(alpha_s=3.4e-6, **args, **ON_NVLINK)
    margin = 7168 * (12288 - 989e12 / 450e9 * 4 * 63 / 64)
    assert c == pytest.approx(2 * 63 * 3.4e-6 * 989e12 / margin / 4)
    assert c == pytest.approx(4066.05, rel=1e-6)  # 63 steps of 3.4 us, twice: 428 us to hide
    assert E.ep_overlap_min_tokens_per_expert(alpha_s=0, **args, **ON_NVLINK) == 0
    one = dict(args, ep=1)
    assert E.ep_overlap_min_tokens_per_expert(alpha_s=1e-5, **one, **ON_IB) == 0


def test_bad_input():
    with pytest.raises(ValueError, match=r"link_GBps = 0: expected a number > 0"):
        E.dp_overlap_min_tokens(world_size=8, peak_flops=H100, link_GBps=0)
    with pytest.raises(ValueError, match=r"mfu = 1.5: expected a number <= 1"):
        E.fsdp_overlap_min_tokens(world_size=8, mfu=1.5, **ON_IB)
    with pytest.raises(TypeError, match=r"world_size = 8.5: expected an int"):
        E.dp_overlap_min_tokens(world_size=8.5, **ON_IB)
    with pytest.raises(ValueError, match=r"alpha_s = 1e-05: expected tokens too"):
        E.tp_overlap_min_hidden(tp=8, alpha_s=1e-5, **ON_NVLINK)
    with pytest.raises(ValueError, match=r"target = 1: expected a fraction in \(0, 1\)"):
        E.pp_bubble_micro_batches(8, 1)
    with pytest.raises(ValueError, match=r"heads = 12: expected a multiple of tp = 8"):
        E.cp_ring_overlap_min_tokens(heads=12, tp=8, **ON_IB)
    with pytest.raises(ValueError, match=r"kv_heads = 3: expected a multiple or a divisor"):
        E.cp_ring_overlap_min_tokens(heads=24, kv_heads=3, tp=8, **ON_IB)
    with pytest.raises(ValueError, match=r"experts = 10: expected a multiple of ep = 4"):
        E.ep_overlap_min_tokens_per_expert(hidden=8, ffn=8, experts=10, ep=4, alpha_s=0, **ON_IB)
    with pytest.raises(ValueError, match=r"peak_flops = inf: expected a finite number"):
        E.pp_transfer_to_compute(hidden=8, layers=1, peak_flops=math.inf, link_GBps=1)
