"""course_lib.shape.ModelShape: the one model shape, its checks, the configs that produce it, and
the old names of estimate's formulas (kept one release) against the ones that stay."""

from __future__ import annotations

import dataclasses
import math
import typing

import pytest

from course_lib import plan as P
from course_lib.measure import estimate as E
from course_lib.measure.estimate import tensor_parallel as TP
from course_lib.models import GPT, GPTConfig, Llama, LlamaConfig, count_params
from course_lib.shape import ModelShape

GPT_CONFIGS = [
    GPTConfig.tiny(),
    GPTConfig.tiny(bias=False),
    GPTConfig.tiny(tie_weights=False),
    GPTConfig.tiny(bias=False, tie_weights=False, n_layer=3, n_embd=48, n_head=3),
    GPTConfig.gpt2_small(),
]


def _llama7b() -> ModelShape:
    return ModelShape("7B", 32, 4096, 32, 32, 11008, 32000, 4096)


# ---- the shape ------------------------------------------------------------------------------
def test_a_shape_knows_its_derived_widths():
    s = P.model("Llama-2-70B").shape()
    assert type(s) is ModelShape and (s.head_dim, s.kv_hidden, s.moe_layers) == (128, 1024, 0)
    assert P.model("DeepSeek-V3").moe_layers == 61 - 3
    assert set(s.dense()) <= set(typing.get_type_hints(E.transformer_param_count))
    assert s.not_llama() == [] and "bias = True" in P.model("GPT-3-175B").not_llama()


@pytest.mark.parametrize(
    "change, exc, words",
    [
        (dict(name=3), TypeError, "name = 3: expected a str"),
        (dict(layers=0), ValueError, "layers = 0: expected an int >= 1"),
        (dict(seq=2.5), TypeError, "seq = 2.5: expected an int"),
        (dict(bias=1), TypeError, "bias = 1: expected True or False"),
        (dict(norm="batchnorm"), ValueError, "norm = 'batchnorm': expected one of rmsnorm"),
        (dict(heads=3), ValueError, "heads = 3: expected a divisor of hidden = 4096"),
        (dict(kv_heads=5), ValueError, "kv_heads = 5: expected a divisor of heads = 32"),
        (dict(experts=8, top_k=9, expert_ffn=64), ValueError, "top_k = 9: expected an int in 1..8"),
        (dict(experts=8, top_k=2), ValueError, "expert_ffn = 0: expected an int >= 1"),
        (dict(top_k=2), ValueError, "top_k = 2: expected an int in 0..0"),
    ],
)
def test_every_field_is_checked(change, exc, words):
    with pytest.raises(exc, match=words.replace("(", r"\(").replace(")", r"\)")):
        dataclasses.replace(_llama7b(), **change)


@pytest.mark.parametrize("config", GPT_CONFIGS, ids=lambda c: f"L{c.n_layer}h{c.n_embd}b{c.bias}")
def test_gpt_config_shape_counts_the_built_model(config):
    if config.n_embd > 256:  # GPT-2 small: count without building it twice
        want = 124_439_808
    else:
        want = count_params(GPT(config))
    assert E.transformer_param_count(**config.shape().dense())["total"] == want


def test_llama_config_shape_counts_the_built_model():
    tiny = LlamaConfig.tiny()
    assert E.transformer_param_count(**tiny.shape().dense())["total"] == count_params(Llama(tiny))
    big = LlamaConfig.llama_7b_like().shape()
    assert E.transformer_param_count(**big.dense())["total"] == 6_738_415_616
    assert big.replace(name="Llama-2-7B", seq=4096) == P.model("Llama-2-7B").shape()


def test_model_spec_is_a_shape_and_seq_len_names_seq_for_one_release():
    m = P.model("Llama-2-7B")
    assert isinstance(m, ModelShape) and m.seq == m.seq_len == 4096
    assert m.replace(seq_len=8192).seq == 8192 == m.replace(seq=8192).seq
    assert dataclasses.replace(m, seq_len=1024).seq == 1024
    assert P.ModelSpec("x", 2, 64, 4, 4, 128, 100, seq_len=32) == P.ModelSpec(
        "x", 2, 64, 4, 4, 128, 100, seq=32
    )


# ---- the old names, kept one release ----------------------------------------------------------
@pytest.mark.parametrize("config", GPT_CONFIGS, ids=lambda c: f"L{c.n_layer}h{c.n_embd}b{c.bias}")
def test_gpt_param_count_is_transformer_param_count(config):
    C, L, V, T = config.n_embd, config.n_layer, config.vocab_size, config.block_size
    norm = 2 * C if config.bias else C  # the count as it was written before (by hand)
    by_hand = L * (12 * C * C + (9 * C if config.bias else 0) + 2 * norm)
    by_hand += V * C * (1 if config.tie_weights else 2) + T * C + norm
    old = E.gpt_param_count(
        n_layer=L,
        n_embd=C,
        vocab_size=V,
        block_size=T,
        bias=config.bias,
        tie_weights=config.tie_weights,
    )
    assert old == by_hand == E.transformer_param_count(**config.shape().dense())["total"]


@pytest.mark.parametrize(
    "config", [*GPT_CONFIGS[:4], LlamaConfig.tiny(), LlamaConfig.llama_7b_like()], ids=str
)
def test_tp_layer_params_come_from_the_one_count(config):
    sharded, replicated = TP._layer_params(config)
    assert sharded + replicated == E.transformer_param_count(**config.shape().dense())["per_layer"]
    C = config.n_embd
    if isinstance(config, LlamaConfig):  # q, k, v, o; w1, w2, w3; two RMSNorms (as before)
        assert (sharded, replicated) == (4 * C * C + 3 * C * config.ffn_hidden, 2 * C)
    else:
        b = 1 if config.bias else 0
        assert (sharded, replicated) == (
            12 * C * C + b * 7 * C,
            2 * (2 * C if b else C) + b * 2 * C,
        )
    assert TP._layer_params(config.shape()) == (sharded, replicated)


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
@pytest.mark.parametrize("s, b, h", [(4096, 1, 4096), (2048, 4, 12288), (512, 2, 8192)])
def test_tp_payload_bytes_is_tp_comm_bytes_payloads(recompute, s, b, h):
    calls = 6 if recompute == "full" else 4  # the count before the merge
    old = E.tp_payload_bytes_per_layer(s, b, h, recompute=recompute)
    assert old == calls * s * b * h * 2
    for tp in (2, 8):
        assert E.tp_comm_bytes_per_layer(s, b, h, tp, recompute=recompute)["payloads"] == old
    none = E.tp_comm_bytes_per_layer(s, b, h, 8)
    full = E.tp_comm_bytes_per_layer(s, b, h, 8, recompute="full")
    assert full["sent_forward"] == none["sent_forward"]
    assert full["sent_backward"] == 2 * none["sent_backward"]  # the forward's 2 again, + its 2


@pytest.mark.parametrize(
    "n, tokens, days, peak, mfu",
    [
        (175 * 10**9, 300 * 10**9, 30, 125e12, 0.5),
        (175 * 10**9, 300 * 10**9, 30, 312e12, 0.5),
        (175 * 10**9, 300 * 10**9, 30, 989e12, 0.5),
        (7 * 10**9, 2 * 10**12, 21, 989e12, 0.4),
        (70 * 10**9, 15 * 10**12, 90, 989e12, 0.38),
    ],
)
def test_gpus_for_training_and_training_days_are_the_kept_functions(n, tokens, days, peak, mfu):
    flops = 6 * n * tokens
    by_hand = math.ceil(flops / (days * 86_400 * peak * mfu))  # the formula before the merge
    old = E.gpus_for_training(n, tokens, days=days, peak_flops=peak, mfu=mfu)
    assert old == by_hand == math.ceil(E.gpus_for_days(flops, days=days, peak_flops=peak, mfu=mfu))
    hours = E.gpu_hours(flops, peak_flops=peak, mfu=mfu)
    for gpus in (old, 1024):
        got = E.training_days(flops, gpus=gpus, peak_flops=peak, mfu=mfu)
        assert got == pytest.approx(flops / (gpus * peak * mfu) / 86_400, rel=1e-12)
        assert got == pytest.approx(hours / gpus / 24, rel=1e-12)
    assert E.training_days(0, gpus=8, peak_flops=peak, mfu=mfu) == 0


def test_checkpoint_policies_are_spelled_one_way():
    from course_lib.techniques import checkpointing
    from course_lib.virtual import simulate

    recompute = typing.get_args(E.Recompute)
    assert set(recompute) <= set(typing.get_args(E.CheckpointPolicy)) == set(E.CHECKPOINT_POLICIES)
    assert checkpointing.POLICIES is E.CHECKPOINT_POLICIES
    assert set(simulate.CHECKPOINT) == {None, *recompute}


def test_a_config_with_llama_field_names_still_counts_as_its_layer():
    from types import SimpleNamespace

    from course_lib.units.u11_tensor_parallelism.run_scale import LLAMA_70B

    s = SimpleNamespace(
        n_embd=8192, n_head=64, n_kv_head=8, ffn_hidden=28672, n_layer=80, vocab_size=32000
    )
    kv = s.n_embd // s.n_head * s.n_kv_head  # grouped-query attention: 8 KV heads of 128
    want = (2 * s.n_embd**2 + 2 * s.n_embd * kv + 3 * s.n_embd * s.ffn_hidden, 2 * s.n_embd)
    assert TP._layer_params(s) == want == TP._layer_params(LLAMA_70B)  # the same layer
    with pytest.raises(TypeError, match="config = 3: expected a ModelShape, GPTConfig or Llama"):
        TP._layer_params(3)
