"""One function per quantity: where a second place needs a quantity estimate computes, it calls
estimate's function, and the two agree on values derived by hand here (the all-to-all bytes of
an MoE layer in estimate.overlap and plan.moe_time, MFU from GPU-hours, the bytes of a
gathered dtype)."""

from __future__ import annotations

import pytest

from course_lib import plan as P
from course_lib.measure import estimate
from course_lib.plan import moe_time as MT


def test_an_assignment_moves_its_row_four_times():
    # dispatch and combine, forward and backward: 4 x 4,096 x 2 bytes
    assert estimate.ep_all_to_all_bytes_per_assignment(4096) == 32_768
    assert estimate.ep_all_to_all_bytes_per_assignment(4096, backward=False) == 16_384
    assert estimate.ep_all_to_all_bytes_per_assignment(10, dtype_bytes=4) == 160
    # per token under uniform routing: top_k copies, (ep - 1)/ep of them leave the rank
    assert estimate.ep_all_to_all_bytes_per_token(4096, ep=8, top_k=2) == 2 * 7 * 32_768 // 8
    assert estimate.ep_all_to_all_bytes_per_token(10, ep=3, top_k=1) == pytest.approx(80 * 2 / 3)
    with pytest.raises(ValueError, match="backward = 'yes': expected one of True, False"):
        estimate.ep_all_to_all_bytes_per_assignment(8, backward="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="hidden = 0: expected"):
        estimate.ep_all_to_all_bytes_per_assignment(0)


def test_the_planner_prices_the_bytes_estimate_counts():
    # Mixtral 8x7B (h 4,096, top-2) on one node of 8 H100s, ep = 8: every copy that leaves
    # its rank stays on NVLink; 4,096 tokens x 2 x 7/8 x 32,768 B = 234,881,024 B at 360 GB/s
    model, cluster = P.model("Mixtral-8x7B"), P.cluster("8xH100 + 400G IB", gpus=8)
    a2a = MT.all_to_all(model, cluster, P.Layout(8, ep=8))
    sent = model.seq * estimate.ep_all_to_all_bytes_per_token(4096, ep=8, top_k=2)
    assert sent == 4096 * 2 * 7 * 32_768 // 8 == 234_881_024
    assert a2a.nvlink == pytest.approx(234_881_024 / 360e9)
    assert (a2a.network, a2a.network_bytes) == (0.0, 0.0)
    # two nodes, ep = 16 over them: a token's copies leave the node 2 x 1/2 times on average
    two = MT.all_to_all(model, P.cluster("8xH100 + 400G IB", gpus=16), P.Layout(16, ep=16))
    assert two.network_bytes == pytest.approx(2 * 1 / 2 * 32_768)


def test_the_overlap_threshold_balances_compute_and_the_same_bytes():
    # h 1,024, f 4,096 (ungated): 2 P_e = 16,777,216 FLOPs a row; F/B = 1e12 / 1e9 = 1,000;
    # a row's forward all-to-all at ep = 2 moves 1/2 x 4,096 B: 2,048,000 FLOPs' worth
    kw = dict(hidden=1024, ffn=4096, experts=8, ep=2, peak_flops=1e12, link_GBps=1.0)
    c = estimate.ep_overlap_min_tokens_per_expert(alpha_s=1e-5, **kw)
    assert c == pytest.approx(2 * 1e-5 * 1e12 / (16_777_216 - 2_048_000) * 2 / 8)
    rows = c * 8 / 2  # what one rank's experts receive
    compute_s = rows * 16_777_216 / 1e12
    row = estimate.ep_all_to_all_bytes_per_assignment(1024, backward=False)
    transfer_s = rows * (2 - 1) / 2 * row / 1e9 + 2 * (2 - 1) * 1e-5
    assert compute_s == pytest.approx(transfer_s)


def test_mfu_from_gpu_hours_is_mfu_over_those_seconds():
    # 1.8e16 FLOPs in 10 hours on a 1 TFLOP/s card: 36,000 s x 1e12 = 3.6e16 possible, so 0.5
    assert estimate.mfu_from_gpu_hours(1.8e16, 10, peak_flops=1e12) == 0.5
    assert estimate.mfu(1.8e16, 10 * 3600, 1e12) == 0.5
    f = estimate.training_flops_per_token(6_738_415_616) * 2 * 10**12
    assert estimate.mfu_from_gpu_hours(f, 184_320, peak_flops=312e12) == estimate.mfu(
        f, 184_320 * 3600, 312e12
    )
    with pytest.raises(ValueError, match="hours = 0: expected"):
        estimate.mfu_from_gpu_hours(1.0, 0, peak_flops=1e12)


def test_a_gathered_width_is_the_bytes_of_its_dtype():
    assert estimate.GATHER_DTYPE_BYTES == {"fp32": 4, "bf16": 2, "fp8": 1}
    assert all(estimate.dtype_bytes(g) == w for g, w in estimate.GATHER_DTYPE_BYTES.items())


@pytest.mark.parametrize(
    "collective, fn, size, n, want",
    [
        ("all_reduce", "ring_allreduce_bytes_sent", 1000, 4, 1500),  # 2 x 3/4 x 1,000
        ("all_gather", "allgather_bytes_sent", 1000, 4, 750),  # 3 shards of 250
        ("reduce_scatter", "reduce_scatter_bytes_sent", 10, 3, 20 / 3),  # 2 chunks of 10/3
    ],
)
def test_a_collective_sends_what_its_own_function_counts(collective, fn, size, n, want):
    assert estimate.collective_bytes_sent(collective, size, n) == pytest.approx(want)
    assert estimate.collective_bytes_sent(collective, size, n) == getattr(estimate, fn)(size, n)
