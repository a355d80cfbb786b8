"""estimate.cp_*: context parallelism's bytes per rank, activations and causal work, by hand."""

from __future__ import annotations

from fractions import Fraction

import pytest

from course_lib.measure import estimate as E

LLAMA = dict(kv_heads=8, tp=8)  # Llama 3 405B: 128 heads, 8 K/V heads, width 16,384


def test_comm_bytes_llama3_128k():
    kv = 2 * 8192 * 1 * 128 * 2  # this GPU's K and V: 8,192 tokens, 1 K/V head, head dim 128, bf16
    ag = E.cp_comm_bytes_per_layer(131072, 1, 16384, 128, 16, method="allgather", **LLAMA)
    ring = E.cp_comm_bytes_per_layer(131072, 1, 16384, 128, 16, method="ring", **LLAMA)
    assert ag["kv_shard"] == kv and ag["sent"] == 2 * 15 * kv == 120 * 2**20
    assert ring["sent_forward"] == 15 * kv and ring["sent"] == (3 * 16 - 2) * kv
    assert E.cp_comm_bytes_per_layer(8192, 1, 16384, 128, 1, method="ring", **LLAMA)["sent"] == 0


def test_comm_bytes_ulysses_and_calls():
    u = E.cp_comm_bytes_per_layer(64, 1, 64, 8, 4, kv_heads=4, method="ulysses", dtype_bytes=4)
    q, kv = 16 * 8 * 8 * 4, 2 * 16 * 4 * 8 * 4
    assert u["sent_forward"] == u["sent_backward"] == 3 * (2 * q + kv) // 4
    assert E.cp_collectives_per_layer(4, method="ulysses")["forward"] == {"all_to_all": 3}
    assert E.cp_collectives_per_layer(3)["backward"] == {"isend": 5, "irecv": 5}
    assert E.cp_collectives_per_layer(1, method="allgather") == {"forward": {}, "backward": {}}
    with pytest.raises(ValueError, match="cp = 16: expected a divisor of the heads"):
        E.cp_comm_bytes_per_layer(131072, 1, 16384, 128, 16, method="ulysses", **LLAMA)
    with pytest.raises(ValueError, match="seq = 100: expected a multiple of 8"):
        E.cp_comm_bytes_per_layer(100, 1, 64, 8, 8)
    with pytest.raises(ValueError, match="method = 'tree'"):
        E.cp_comm_bytes_per_layer(64, 1, 64, 8, 2, method="tree")


def test_activations_reduce_to_korthikanti():
    args = (4096, 1, 4096, 32)
    full = E.activation_bytes_transformer_layer(*args, dropout=True)
    assert E.cp_activation_bytes_per_layer(*args, flash=False, dropout=True) == full
    flash = E.activation_bytes_transformer_layer(*args, recompute="selective", dropout=False)
    assert E.cp_activation_bytes_per_layer(*args) == flash
    # 8 ranks of the sequence: the layer of 512 tokens, the same as a 512-token sequence
    assert E.cp_activation_bytes_per_layer(*args, cp=8) == E.cp_activation_bytes_per_layer(
        512, 1, 4096, 32
    )
    # the gathered K/V of the other 7 ranks (32 K/V heads, bf16)
    extra = 7 * 2 * 512 * 4096 * 2
    assert E.cp_activation_bytes_per_layer(*args, cp=8, method="allgather") == flash // 8 + extra


def test_causal_work_per_rank():
    for w in (1, 2, 4, 8):
        contiguous = [E.cp_attention_work(w, rank=r, layout="contiguous") for r in range(w)]
        zigzag = [E.cp_attention_work(w, rank=r) for r in range(w)]
        assert [c["blocks"] for c in contiguous] == list(range(1, w + 1))
        assert {z["blocks"] for z in zigzag} == {2 * w + 1}
        # both cover the causal half of the s^2 scores plus the masked part of the diagonal blocks
        assert sum(c["share"] for c in contiguous) == Fraction(w + 1, 2 * w)
        assert sum(z["share"] for z in zigzag) == Fraction(2 * w + 1, 4 * w)
    assert E.cp_attention_work(4, rank=1, causal=False)["share"] == Fraction(1, 4)


def test_attention_saved_bytes():
    # ring on 2 ranks, 64 tokens, 4 heads of 16, fp32: q, out, k, v (32 x 64 values each) + lse
    assert E.attention_saved_bytes(64, 1, 64, 4, cp=2) == 4 * (4 * 32 * 64 + 4 * 32)
    assert E.attention_saved_bytes(64, 1, 64, 4, blockwise=False) == 185344  # measured in unit 15
    with pytest.raises(ValueError, match="expected 1 and 4"):
        E.attention_saved_bytes(64, 1, 64, 4, cp=2, blockwise=False)
