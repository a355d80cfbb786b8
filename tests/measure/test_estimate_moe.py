"""estimate.moe_*, ep_*: checked by hand, and against the published sizes of Mixtral 8x7B
(arXiv:2401.04088) and DeepSeek-V3 (arXiv:2412.19437)."""

from __future__ import annotations

import pytest

from course_lib.measure import estimate


def test_param_count_mixtral_expert_blocks():
    # Mixtral 8x7B: 32 layers, hidden 4096, SwiGLU ffn 14336, 8 experts, top-2
    p = estimate.moe_param_count(4096, 14336, 8, top_k=2, gated_mlp=True, layers=32)
    assert p["expert"] == 3 * 4096 * 14336
    assert p["total"] == 32 * (4096 * 8 + 8 * p["expert"]) == 45_098_205_184
    assert p["active"] == 32 * (4096 * 8 + 2 * p["expert"])
    small = estimate.moe_param_count(16, 32, 4, top_k=1, bias=True, shared_experts=1)
    assert small == {"expert": 2 * 16 * 32 + 48, "router": 64, "total": 64 + 5 * 1072,
                     "active": 64 + 2 * 1072}  # fmt: skip


def test_capacity():
    assert estimate.moe_capacity(16, 4, top_k=2, capacity_factor=1.0) == 8
    assert estimate.moe_capacity(10, 4, capacity_factor=1.25) == 4  # ceil(3.125)
    assert estimate.moe_capacity(30, 3, capacity_factor=1.1) == 11  # no float residue
    with pytest.raises(ValueError, match="capacity_factor = 0: expected"):
        estimate.moe_capacity(8, 2, capacity_factor=0)


def test_all_to_all_bytes_by_hand():
    routed = [[3, 1, 2, 0], [0, 4, 1, 1]]  # 2 ranks; rank 0 holds experts 0, 1
    b0 = estimate.ep_all_to_all_bytes(routed, 8, rank=0, dtype_bytes=4)
    assert b0["counts"] == 2 * 8 and b0["dispatch"] == 2 * 8 * 4 and b0["combine"] == 4 * 8 * 4
    assert b0["sent"] == b0["sent_forward"] + b0["sent_backward"]
    b1 = estimate.ep_all_to_all_bytes(routed, 8, rank=1, dtype_bytes=4)
    assert b1["dispatch"] == b0["combine"] and b1["combine"] == b0["dispatch"]
    one = estimate.ep_all_to_all_bytes([[5, 3]], 8, rank=0)
    assert one["sent"] == 0
    with pytest.raises(ValueError, match="routed = .*multiple of the ranks"):
        estimate.ep_all_to_all_bytes([[1, 2, 3], [1, 2, 3]], 8, rank=0)
    # uniform routing: 4 k (ep - 1) / ep h p per token
    assert (
        estimate.ep_all_to_all_bytes_per_token(7168, ep=64, top_k=8) == 4 * 8 * 63 * 7168 * 2 // 64
    )


def test_model_state_bytes_under_ep_and_zero():
    m = estimate.moe_model_state_bytes_per_rank(1000, 8000, ep=4, world_size=8, stage=1)
    assert (m["dp"], m["expert_dp"]) == (8, 2)
    assert m["dense"] == estimate.zero_bytes_per_rank(1000, stage=1, world_size=8)
    assert m["experts"] == estimate.zero_bytes_per_rank(8000, stage=1, world_size=2) / 4
    with pytest.raises(ValueError, match="world_size = 6: expected a multiple"):
        estimate.moe_model_state_bytes_per_rank(1, 1, ep=4, world_size=6)
