"""Attention as it is: head_dim apart from hidden / heads, grouped- and multi-query attention
with tp above the K/V heads (K/V replicated, priced), multi-head latent attention and PaLM's
parallel block; every published model's total and active count to the published digit.
Formulas only: no ranks are launched."""

from __future__ import annotations

import dataclasses
import math

import pytest

from course_lib import plan as P
from course_lib.measure import estimate as E
from course_lib.plan import compute_time
from course_lib.plan.comm_model import tp_comm_s
from course_lib.shape import ModelShape

# (model, published total, its last digit, published active, its last digit, how the authors
# shortened the count): DeepSeek-V3 arXiv:2412.19437 Sec. 1 (671B, 37B); Qwen3 model cards
# (30.5B / 3.3B, 235B / 22B); PaLM arXiv:2204.02311 Table 1 (540.35B); Mixtral 8x7B, Mistral
# AI's announcement (46.7B / 12.9B). DeepSeek, Qwen and PaLM cut the count at the digit they
# print (37.55B activated is "37B", 3.35B "3.3B", 540.356B "540.35B"); Mistral rounds it
# (12.88B is "12.9B").
PUBLISHED = [
    ("DeepSeek-V3", 671e9, 1e9, 37e9, 1e9, "cut"),
    ("Qwen3-30B-A3B", 30.5e9, 0.1e9, 3.3e9, 0.1e9, "cut"),
    ("Qwen3-235B-A22B", 235e9, 1e9, 22e9, 1e9, "cut"),
    ("PaLM-540B", 540.35e9, 0.01e9, 540.35e9, 0.01e9, "cut"),
    ("Mixtral-8x7B", 46.7e9, 0.1e9, 12.9e9, 0.1e9, "round"),
]


def _shortened(count: int, unit: float, how: str) -> float:
    digits = count / unit
    return (math.floor(digits) if how == "cut" else round(digits)) * unit


@pytest.mark.parametrize("name, total, unit, active, active_unit, how", PUBLISHED)
def test_each_published_count_to_the_published_digit(name, total, unit, active, active_unit, how):
    m = P.model(name)
    assert _shortened(m.n_params, unit, how) == pytest.approx(total, rel=1e-12)
    assert _shortened(m.active_params, active_unit, how) == pytest.approx(active, rel=1e-12)
    assert m.published_params == total
    if m.experts:
        assert m.published_active == active


def test_the_counts_by_hand():
    # DeepSeek-V3's MLA: q down 7168 x 1536 + norm 1536 + up 1536 x 128 (128 + 64); joint K/V
    # down 7168 x (512 + 64) + norm 512 + K, V up 512 x 128 (128 + 128); o 128 x 128 x 7168
    mla = (7168 * 1536 + 1536 + 1536 * 128 * 192) + (7168 * 576 + 512 + 512 * 128 * 256)
    mla += 128 * 128 * 7168
    assert mla == 187_107_328
    ds = P.model("DeepSeek-V3")
    assert E.attention_param_count(**_attention(ds))["total"] == mla
    expert, embed = 3 * 7168 * 2048, 129280 * 7168
    dense_layer = mla + 3 * 7168 * 18432 + 2 * 7168
    moe_layer = mla + 256 * 7168 + 257 * expert + 2 * 7168
    assert ds.n_params == 3 * dense_layer + 58 * moe_layer + 2 * embed + 7168
    assert ds.active_params == ds.n_params - 58 * 248 * expert
    # Qwen3-235B-A22B: q and o 4096 x 8192 (64 heads of 128), k and v 4096 x 512, QK-norm 2 x 128
    qwen = P.model("Qwen3-235B-A22B")
    layer = 2 * 4096 * 8192 + 2 * 4096 * 512 + 256 + 4096 * 128 + 128 * 3 * 4096 * 1536
    assert qwen.n_params == 94 * (layer + 2 * 4096) + 2 * 151936 * 4096 + 4096
    # PaLM: 48 heads of 256 (q, o 18432 x 12288), one K/V head, one norm per layer (parallel)
    palm = P.model("PaLM-540B")
    layer = 2 * 18432 * 12288 + 2 * 18432 * 256 + 3 * 18432 * 73728 + 18432
    assert palm.n_params == 118 * layer + 256000 * 18432 + 18432 == 540_356_474_880


def _attention(m):
    keys = ("hidden", "heads", "kv_heads", "head_dim", "q_lora_rank", "kv_lora_rank")
    return {k: getattr(m, k) for k in (*keys, "rope_head_dim", "v_head_dim")}


def test_head_dim_defaults_to_hidden_over_heads_and_follows_a_copy():
    s = ModelShape("7B", 32, 4096, 32, 32, 11008, 32000, 4096)
    assert s.head_dim == 128 and s.attention_width == 4096
    assert dataclasses.replace(s, hidden=2048).head_dim == 64  # computed again
    assert s.replace(heads=16, kv_heads=16).head_dim == 256
    wide = s.replace(head_dim=256)  # given: independent of hidden / heads
    assert wide.head_dim == 256 and wide.replace(hidden=2048).head_dim == 256
    assert wide.attention_width == 8192 and wide.not_llama() == ["head_dim = 256"]
    # the old count is unchanged where head_dim = hidden / heads
    assert (
        E.transformer_param_count(**s.dense())["total"]
        == E.transformer_param_count(
            **{
                k: v
                for k, v in s.dense().items()
                if k in ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab")
            }  # fmt: skip
        )["total"]
    )
    with pytest.raises(ValueError, match=r"heads = 3: expected a divisor of hidden = 4096"):
        s.replace(heads=3)
    s.replace(heads=3, kv_heads=1, head_dim=128)  # a head width given: any number of heads


@pytest.mark.parametrize(
    "change, words",
    [
        (dict(rope_head_dim=64), "rope_head_dim = 64: expected an int in 0..0"),
        (dict(q_lora_rank=8), "q_lora_rank = 8: expected an int in 0..0"),
        (dict(kv_lora_rank=512, kv_heads=8), "kv_heads = 8: expected heads = 32 with multi-head"),
        (dict(head_dim=-1), "head_dim = -1: expected an int >= 1"),
        (dict(qk_norm=1), "qk_norm = 1: expected True or False"),
    ],
)
def test_attention_fields_are_checked(change, words):
    with pytest.raises((ValueError, TypeError), match=words):
        ModelShape("7B", 32, 4096, 32, 32, 11008, 32000, 4096).replace(**change)


def test_mla_flops_count_its_own_attention_core():
    ds = P.model("DeepSeek-V3")
    # 128 heads x (query-key 128 + 64, value 128) / 2 = 20,480: 2.86 x the width
    assert ds.attention_width == 128 * (192 + 128) // 2 == 20480
    lp = ds.layer_params()
    n = 3 * lp["dense"] + 58 * lp["moe_active"] + 129280 * 7168
    model, hardware = ds.flops_per_token("selective")
    assert model == 6 * n + 12 * 61 * 4096 * 20480
    assert hardware - model == 61 * 4 * 4096 * 20480  # the core's forward, again
    # PaLM's count, 6 N + 12 L H Q T with H Q = 48 x 256 (its App. B)
    palm = P.model("PaLM-540B")
    n = palm.n_params - 18432  # tied: the embedding is the output product; the final norm is none
    assert palm.flops_per_token()[0] == 6 * n + 12 * 118 * 2048 * 48 * 256


def test_tp_above_the_kv_heads_replicates_them_and_pays_for_it():
    palm = P.model("PaLM-540B")  # one K/V head: every tp dividing the 48 heads is allowed
    P.check_layout(palm, P.Layout(1, tp=12))
    kv = 2 * 18432 * 256  # the K and V projections of one head
    assert palm.kv_replicated(1) == 0 and palm.kv_replicated(12) == 11 * kv
    qwen = P.model("Qwen3-235B-A22B")  # 4 K/V heads
    assert qwen.kv_replicated(4) == 0 and qwen.kv_replicated(8) == 2 * 4096 * 4 * 128
    with pytest.raises(
        ValueError,
        match=r"tp = 3: expected a divisor of heads = 64 and kv_heads = 4 \(or a multiple",
    ):
        P.check_layout(qwen, P.Layout(1, tp=3))  # fmt: skip
    # priced in bytes: each rank keeps one whole K/V head per layer, not 1/12 of one (the last
    # of 59 stages: 2 layers, the final norm and the tied output matrix, bf16 weights)
    parts = palm.params()
    for t in (6, 12):
        dense = 2 * (parts["per_layer"] + palm.kv_replicated(t)) + parts["other"]
        held = P.predict_memory(palm, P.Layout(1, tp=t, pp=59), stage="last")["params"]
        assert held == 2 * -(-(dense + parts["embedding"]) // t)
    # and in FLOPs: the replicated projections run on every rank of the group, as much work
    # as 12 K/V heads split 12 ways; 11/12 of it more than one head's projections split
    cl = P.cluster("TPU v4 pod", gpus=3072)
    kw = dict(global_batch_tokens=256 * 2048)
    t12 = P.step_time(palm, cl, P.Layout(256, tp=12), **kw)["compute_s"]
    twelve = P.step_time(palm.replace(kv_heads=12), cl, P.Layout(256, tp=12), **kw)["compute_s"]
    assert t12 == pytest.approx(twelve, rel=1e-12)
    flops = compute_time.stage_flops(palm, P.Layout(256, tp=12), 118, output=True)[0]
    alone = compute_time.stage_flops(palm, P.Layout(256, tp=1), 118, output=True)[0]
    assert flops - alone == 6 * 118 * 11 * kv


def test_a_parallel_block_has_one_norm_and_one_all_reduce_per_pass():
    palm = P.model("PaLM-540B")
    serial = palm.replace(parallel_block=False)
    assert serial.params()["per_layer"] - palm.params()["per_layer"] == 18432
    cl = P.cluster("TPU v4 pod")
    lay = P.Layout(1, tp=12)
    assert tp_comm_s(palm, cl, lay, 10, 0.0) == pytest.approx(
        tp_comm_s(serial, cl, lay, 10, 0.0) / 2
    )
