"""estimate.planning against numbers worked out by hand or published by the papers."""

from __future__ import annotations

import pytest

from course_lib.measure import estimate as E

LLAMA2_7B = dict(layers=32, hidden=4096, heads=32, kv_heads=32, ffn=11008, vocab=32000)
GPT = dict(gated_mlp=False, bias=True, norm="layernorm", tied_embeddings=True)


@pytest.mark.parametrize(
    "shape, published",
    [
        (LLAMA2_7B, 6_738_415_616),  # Llama-2-7B as released
        (
            dict(layers=80, hidden=8192, heads=64, kv_heads=8, ffn=28672, vocab=32000),
            68_976_648_192,
        ),
        (
            dict(layers=126, hidden=16384, heads=128, kv_heads=8, ffn=53248, vocab=128256),
            405_853_388_800,
        ),
        (
            dict(
                layers=70,
                hidden=14336,
                heads=112,
                kv_heads=112,
                ffn=4 * 14336,
                vocab=250880,
                embedding_norm=True,
                **GPT,
            ),
            176_247_271_424,
        ),  # BLOOM paper, Table 3
    ],
)
def test_parameter_counts_match_the_released_models_exactly(shape, published):
    assert E.transformer_param_count(**shape)["total"] == published


def test_gpt3_is_175b_to_half_a_percent_and_12_l_h2_dominates():
    n = E.transformer_param_count(
        layers=96,
        hidden=12288,
        heads=96,
        kv_heads=96,
        ffn=4 * 12288,
        vocab=50257,
        seq=2048,
        learned_positions=True,
        **GPT,
    )
    assert n["total"] == pytest.approx(175.0e9, rel=5e-3)
    assert n["layers"] == pytest.approx(12 * 96 * 12288**2, rel=1e-3)  # 12 L h^2 + 13 L h


def test_llama_7b_parts_by_hand():
    n = E.transformer_param_count(**LLAMA2_7B)
    # attention 4 h^2 + MLP 3 h f + two RMSNorm weights
    assert n["per_layer"] == 4 * 4096**2 + 3 * 4096 * 11008 + 2 * 4096 == 202_383_360
    assert n["embedding"] == n["output"] == 131_072_000


# Korthikanti et al. 2022 at GPT-3's shape: s 2048, b 1, h 12288, a 96 (bytes, 16-bit values)
S, B, H, A = 2048, 1, 12288, 96
SBH = S * B * H  # 25,165,824


def test_korthikanti_eq1_no_parallelism():
    # 34 sbh + 5 a s^2 b = 855,638,016 + 2,013,265,920
    assert E.activation_bytes_transformer_layer(S, B, H, A) == 2_868_903_936
    assert E.activation_bytes_transformer_layer(S, B, H, A, sequence_parallel=True) == 2_868_903_936


def test_korthikanti_eq2_tensor_parallel_without_sequence_parallel():
    # sbh (10 + 24/8 + 5 a s / (8 h)) = sbh (10 + 3 + 10)
    got = E.activation_bytes_transformer_layer(S, B, H, A, tp=8, sequence_parallel=False)
    assert got == 23 * SBH == 578_813_952


@pytest.mark.parametrize(
    "recompute, expected",
    [
        ("none", 2_868_903_936 // 8),  # Eq. 4: (34 sbh + 5 a s^2 b) / t
        ("selective", 34 * SBH // 8),  # Eq. 6 / t
        ("full", 2 * SBH // 8),  # the layer input, split by sequence parallelism
    ],
)
def test_korthikanti_with_sequence_parallel(recompute, expected):
    assert (
        E.activation_bytes_transformer_layer(
            S, B, H, A, tp=8, sequence_parallel=True, recompute=recompute
        )
        == expected
    )


def test_grouped_query_attention_and_swiglu_by_hand():
    # Llama-2-70B, s 4096, b 1, selective, no dropout: QKV input 2, Q 2, K and V 4 x 8/64,
    # projection input 2, MLP input 2, two norm inputs 4 -> 12.5 sbh; SwiGLU 6 s f
    s, h, f = 4096, 8192, 28672
    expected = int(12.5 * s * h) + 6 * s * f
    assert expected == 1_124_073_472
    got = E.activation_bytes_transformer_layer(
        s, 1, h, 64, kv_heads=8, ffn=f, gated_mlp=True, dropout=False, recompute="selective"
    )
    assert got == expected


def test_pipeline_inflight_layers():
    assert E.pipeline_inflight_layers(4, 4, 8) == 16  # 1F1B: p micro-batches of L/p layers = L
    assert E.pipeline_inflight_layers(4, 4, 2) == 8  # only m = 2 micro-batches exist
    # interleaved v = 2: L (1 + (p - 1) / (p v)) = 16 (1 + 3/8) = 22 (Korthikanti Sec. 4.2.3)
    assert E.pipeline_inflight_layers(4, 4, 16, 2) == 22
    with pytest.raises(
        ValueError, match="virtual_stages = 3: expected a divisor of layers_per_stage = 4"
    ):
        E.pipeline_inflight_layers(4, 4, 16, 3)


def test_model_flops_and_recompute_flops():
    assert E.training_flops_per_token(7_000_000_000) == 42_000_000_000
    assert E.training_flops_per_token(10, layers=2, hidden=3, seq=5) == 60 + 12 * 30
    assert E.training_flops_per_token(2 * 100, layers=2, hidden=3, seq=5) == 2 * (600 + 180)
    full = E.recompute_flops_per_token(100, layers=2, hidden=3, seq=5, recompute="full")
    assert full == 2 * (200 + 60)
    assert E.recompute_flops_per_token(100, layers=2, hidden=3, seq=5, recompute="selective") == 120
    assert E.recompute_flops_per_token(100, layers=2, hidden=3, seq=5) == 0
    assert E.tp_payload_bytes_per_layer(2048, 1, 12288) == 4 * 2 * SBH
    assert E.tp_payload_bytes_per_layer(2048, 1, 12288, recompute="full") == 6 * 2 * SBH


def test_the_sources_budget_numbers():
    flops = E.training_flops_per_token(175 * 10**9) * 300 * 10**9
    assert flops == 315 * 10**21
    gpus = {
        name: round(E.gpus_for_days(flops, days=30, peak_flops=peak, mfu=0.5))
        for name, peak in {"V100": 125e12, "A100": 312e12, "H100": 989e12}.items()
    }
    assert gpus == {"V100": 1944, "A100": 779, "H100": 246}
    seven = E.training_flops_per_token(7 * 10**9) * 2 * 10**12
    assert seven == 84 * 10**21
    assert E.gpu_hours(seven, peak_flops=989e12, mfu=0.5) == pytest.approx(47_194, rel=1e-3)
    # Llama-2-7B: 184,320 A100-hours for 2T tokens (Touvron et al. 2023, Table 2) -> 39 % MFU
    mfu = E.mfu_from_gpu_hours(
        E.training_flops_per_token(6_738_415_616) * 2 * 10**12, 184_320, peak_flops=312e12
    )
    assert 0.38 < mfu < 0.40


def test_bad_input_is_refused():
    with pytest.raises(
        ValueError, match="recompute = 'some': expected one of none, selective, full"
    ):
        E.activation_bytes_transformer_layer(S, B, H, A, recompute="some")
    with pytest.raises(ValueError, match="kv_heads = 5"):
        E.transformer_param_count(**{**LLAMA2_7B, "kv_heads": 5})
    with pytest.raises(ValueError, match="mfu = 1.5: expected a number <= 1"):
        E.gpus_for_days(1e20, days=1, peak_flops=1e12, mfu=1.5)
