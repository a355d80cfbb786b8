"""Training-scale formulas against numbers worked out by hand (and against the model itself)."""

from __future__ import annotations

import pytest
import torch

from course_lib.measure import estimate
from course_lib.models import GPT, GPTConfig, count_params


@pytest.mark.parametrize(
    "cfg",
    [
        GPTConfig.tiny(),
        GPTConfig.tiny(bias=False, n_layer=3, n_embd=48),
        GPTConfig.tiny(tie_weights=False, vocab_size=97),
    ],
)
def test_gpt_param_count_matches_the_model(cfg):
    with torch.device("meta"):
        model = GPT(cfg)
    assert estimate.gpt_param_count(
        n_layer=cfg.n_layer,
        n_embd=cfg.n_embd,
        vocab_size=cfg.vocab_size,
        block_size=cfg.block_size,
        bias=cfg.bias,
        tie_weights=cfg.tie_weights,
    ) == count_params(model)


def test_gpt2_small_is_124m():
    # nanoGPT's GPT-2 small: 124,439,808 parameters (tied head)
    assert (
        estimate.gpt_param_count(n_layer=12, n_embd=768, vocab_size=50257, block_size=1024)
        == 124_439_808
    )


def test_six_nd_worked_example_and_gpus():
    # 6 x 175e9 x 300e9 = 3.15e23 (the sources print 3.14e23)
    assert estimate.training_flops_per_token(175 * 10**9) * 300 * 10**9 == 315 * 10**21
    # 3.15e23 / (30 x 86400 s x peak x 0.5), by hand: V100 1944.4, A100 779.02, H100 245.8 -> whole GPUs (ceil)
    got = {
        name: estimate.gpus_for_training(
            175 * 10**9,
            300 * 10**9,
            days=30,
            peak_flops=estimate.gpu_spec(name).peak_flops,
            mfu=0.5,
        )
        for name in ("V100", "A100", "H100")
    }
    assert got == {"V100": 1945, "A100": 780, "H100": 246}
    # and back: 246 H100 finish in just under 30 days
    assert 29.9 < estimate.training_days(3.15e23, gpus=246, peak_flops=989e12, mfu=0.5) < 30.0


def test_flops_per_token_and_mfu():
    assert estimate.training_flops_per_token(1000) == 6000
    assert (
        estimate.training_flops_per_token(1000, layers=2, seq=64, hidden=64)
        == 6000 + 12 * 2 * 64 * 64
    )
    assert estimate.mfu(1e12, 2.0, 1e12) == 0.5
    with pytest.raises(ValueError, match="step_s"):
        estimate.mfu(1.0, 0.0, 1.0)


def test_ridge_points_and_compute_bound_batch():
    assert estimate.gpu_spec("h100").ridge == pytest.approx(295.2, abs=0.1)  # 989e12 / 3.35e12
    assert estimate.gpu_spec("A100").ridge == pytest.approx(153.0, abs=0.1)  # 312e12 / 2.039e12
    # d = 4096, ridge 295.2, bf16: B >= 295.2*2*4096 / (8192 - 1180.9) = 344.9 -> 345
    b = estimate.compute_bound_batch(4096, estimate.gpu_spec("H100").ridge, dtype_bytes=2)
    assert b == 345
    assert (
        estimate.matmul_arithmetic_intensity(b, 4096, 4096, dtype_bytes=2)
        >= estimate.gpu_spec("H100").ridge
    )
    assert (
        estimate.matmul_arithmetic_intensity(b - 1, 4096, 4096, dtype_bytes=2)
        < estimate.gpu_spec("H100").ridge
    )
    with pytest.raises(ValueError, match="width = 100"):
        estimate.compute_bound_batch(100, 295.0, dtype_bytes=2)
    with pytest.raises(ValueError, match="name = 'TPU'"):
        estimate.gpu_spec("TPU")


def test_learning_rate_rules():
    assert estimate.linear_scaled_lr(0.1, 256, 8192) == pytest.approx(3.2)  # Goyal et al.: 0.1 x 32
    assert [estimate.warmup_lr(s, 1.0, warmup_steps=4) for s in range(6)] == [
        0.25,
        0.5,
        0.75,
        1.0,
        1.0,
        1.0,
    ]
    assert estimate.warmup_lr(3, 0.5, warmup_steps=0) == 0.5
    assert estimate.simple_noise_scale(30.0, 2.0) == 15.0


def test_memory_tiers_fastest_first():
    tiers = estimate.MEMORY_TIERS_A100
    sized = [t.capacity_bytes for t in tiers[1:]]
    assert sized == sorted(sized)
    speeds = [t.bytes_per_s for t in tiers[1:]]
    assert speeds == sorted(speeds, reverse=True)
