"""Experts as they run and products by shape: the all-to-all on the links it crosses
(node-limited routing, capacity factor), what each schedule hides, the step's compute product
by product, FP8 MFU against both peaks, and the explanation of an MoE winner. Formulas only."""

from __future__ import annotations

import math

import pytest

from course_lib import plan as P
from course_lib.plan import gemm_time as G
from course_lib.plan import moe_time as MT
from course_lib.plan.published import RUNS

H800, H100 = "8xH800 + 400G IB", "8xH100 + 400G IB"


def test_balanced_all_to_all_is_unit_16s_bytes_on_the_links_they_cross():
    """Uniform routing, by hand: the rank's 4,096 tokens x unit 16's bytes per token, the share
    for peers in the node over NVLink and the rest over the network side by side (the slower
    sets the pace), plus one alpha of the slowest link per all-to-all (4)."""
    from course_lib.measure import estimate

    ds = P.model("DeepSeek-V3")
    sent = 4096 * estimate.ep_all_to_all_bytes_per_token(7168, ep=8, top_k=8)
    cl = P.cluster(H800, gpus=8)  # one node: every peer on NVLink
    want = sent / (cl.intra_GBps * 1e9) + 4 * cl.alpha_intra_s
    assert MT.all_to_all(ds, cl, P.Layout(8, ep=8)).total == pytest.approx(want)
    cl = P.cluster(H800, gpus=2048)  # EP 64 on 8 nodes: 7 of the 63 peers in the node
    sent = 4096 * estimate.ep_all_to_all_bytes_per_token(7168, ep=64, top_k=8)
    near = 7 / 63
    t = max(sent * near / (cl.intra_GBps * 1e9), sent * (1 - near) / (cl.inter_GBps * 1e9))
    got = MT.all_to_all(ds, cl, P.Layout(128, 1, 16, ep=64)).total
    assert got == pytest.approx(t + 4 * cl.alpha_inter_s)


def test_node_limited_routing_sends_one_copy_per_node():
    ds, cl = P.model("DeepSeek-V3"), P.cluster(H800, gpus=2048)
    lay = P.Layout(128, 1, 16, ep=64)  # 64 ranks on 8 nodes
    free, limited = MT.all_to_all(ds, cl, lay), MT.all_to_all(ds, cl, lay, node_limit=4)
    # 8 copies: 7 leave the node on average, each on its own; node-limited: the distinct nodes
    # of 8 picks over 8, 8 (1 - (7/8)^8) = 5.25, capped at M = 4, of which 7/8 remote
    assert free.network_bytes == pytest.approx(4 * 8 * 7 / 8 * 2 * 7168)
    assert limited.network_bytes == pytest.approx(4 * 4 * 7 / 8 * 2 * 7168)
    assert 8 * (1 - (7 / 8) ** 8) > 4
    assert limited.network == pytest.approx(free.network * 4 / 8)
    assert limited.nvlink > free.nvlink  # forwarded inside the node instead
    # the busiest rank receives c times the mean: c times the transfer
    busy = MT.all_to_all(ds, cl, lay, node_limit=4, capacity_factor=1.25)
    assert busy.total - busy.latency == pytest.approx(1.25 * (limited.total - limited.latency))


@pytest.mark.parametrize(
    "schedule, want", [("none", 5.0), ("1F1B-overlapped", 3.0), ("DualPipe", 0.0)]
)
def test_each_schedule_hides_what_its_compute_covers(schedule, want):
    assert MT.exposed_all_to_all(5.0, schedule, attention_s=2.0, layer_s=6.0) == want
    assert MT.exposed_all_to_all(9.0, "DualPipe", 2.0, 6.0) == 3.0  # never silently all


def test_the_new_assumptions_are_checked():
    with pytest.raises(ValueError, match="ep_schedule = 'dualpipe': expected one of none"):
        P.DEFAULT_ASSUMPTIONS.replace(ep_schedule="dualpipe")
    with pytest.raises(ValueError, match="capacity_factor = 0.5"):
        P.DEFAULT_ASSUMPTIONS.replace(capacity_factor=0.5)
    with pytest.raises(ValueError, match="matmul_model = 'fast'"):
        P.DEFAULT_ASSUMPTIONS.replace(matmul_model="fast")
    for key in ("ep_schedule", "ep_node_limit", "capacity_factor", "comm_sms", "matmul_model"):
        assert P.ASSUMPTION_SOURCES[key]


def test_compute_by_shape_is_the_sum_of_its_products():
    m = P.model("Llama-2-7B")
    cl, lay = P.cluster(H100), P.Layout(8, micro_batch=2)
    how = P.DEFAULT_ASSUMPTIONS.replace(matmul_model="by shape")
    row = P.step_time(m, cl, lay, global_batch_tokens=64 * 4096, assumptions=how)
    lt = G.layer_time(m, cl, 1, 1, 2 * 4096, 4096, True, True, False)
    # forward x 3 for forward and backward, every layer and the output layer; the core again
    assert row["compute_s"] == pytest.approx(
        4 * 3 * (32 * (lt.weights + lt.core + lt.elementwise) + lt.output)
    )
    assert row["recompute_s"] == pytest.approx(4 * 32 * lt.core)
    # the layer's products by hand: q, kv, o, gate+up, down (no MoE), the core over 8192 x 4096
    g = G.layer_gemms(m, 1, 1, 8192, 4096, True)
    assert [tuple(x)[:3] for x in g["attention"] + g["mlp"]] == [
        (8192, 4096, 4096), (8192, 8192, 4096), (8192, 4096, 4096), (8192, 22016, 4096),
        (8192, 4096, 11008)]  # fmt: skip
    assert tuple(g["core"][0]) == (4096, 4096, 256, 2 * 32, 0.0)


def test_expert_products_and_permutation_are_priced_by_their_shapes():
    q = P.model("Qwen3-30B-A3B")
    g = G.layer_gemms(q, 1, 8, 4096, 4096, True, 1.0)
    # 16 local experts, each 8 x 4096 x 8 / 128 = 2,048 rows; router 4096 x 2048 -> 128
    assert g["router"] == [G.Gemm(4096, 128, 2048)]
    assert g["experts"] == [G.Gemm(2048, 1536, 2048, 16), G.Gemm(2048, 2048, 768, 16)]
    busy = G.layer_gemms(q, 1, 8, 4096, 4096, True, 1.5)["experts"][0]
    assert busy.m == 3072
    # the permutation: 2 x 2 x 2 h (1 + top_k) bytes a token, with the router's 2 x 4 E
    plain = q.replace(experts=0, top_k=0, expert_ffn=0, ffn=8 * 768)
    extra = G.elementwise_bytes(q, 1, True, True) - G.elementwise_bytes(plain, 1, True, True)
    assert extra == 2 * 4 * 128 + 8 * 2048 * 9


def test_fp8_mfu_is_reported_against_both_peaks():
    run = RUNS["DeepSeek-V3"]
    row = P.step_time(run.model, P.cluster(run.cluster, gpus=run.gpus), run.layout,
                      global_batch_tokens=run.global_batch_tokens, assumptions=run.assumptions,
                      uneven_stages=True)  # fmt: skip
    assert row["mfu_fp8_peak"] == pytest.approx(row["mfu"] * 989 / 1979)
    assert math.isnan(P.step_time(P.model("Llama-2-7B"), P.cluster(H100), P.Layout(8),
                                  global_batch_tokens=8 * 4096)["mfu_fp8_peak"])  # fmt: skip


def test_the_explanation_of_an_moe_plan_names_its_all_to_all_and_expert_efficiency():
    run = RUNS["DeepSeek-V3"]
    result = P.plan(run.model, P.cluster(run.cluster, gpus=2048), global_batch_tokens=run.global_batch_tokens,
                    uneven_stages=True, assumptions=run.assumptions,
                    only={"tp": [1], "pp": [16], "micro_batch": [1], "v": [1], "zero": [1]})  # fmt: skip
    text = P.explain(result)
    top = result.iloc[0]
    assert f"all-to-all {top.ep_comm_s:.2f} s exposed of {top.ep_all_to_all_s:.2f} s" in text
    assert "schedule DualPipe, node limit 4" in text
    assert f"expert products at {top.expert_gemm_efficiency:.0%} of the FP8 peak" in text
    assert "of the bf16 peak (" in text and "of the FP8 peak: FP8 products" in text
    # the same run with its all-to-alls on the critical path exposes all of them
    none = run.assumptions.replace(ep_schedule="none")
    flat = P.step_time(run.model, P.cluster(run.cluster, gpus=2048), run.layout,
                       global_batch_tokens=run.global_batch_tokens, assumptions=none, uneven_stages=True)  # fmt: skip
    assert flat["ep_comm_s"] == pytest.approx(flat["ep_all_to_all_s"]) and flat["ep_comm_s"] > 0


def test_by_shape_the_dense_runs_stay_near_their_published_speed():
    import dataclasses

    from course_lib.plan import published as PB

    residual = {}
    for name, run in PB.RUNS.items():
        if run.model.experts or name == "PaLM 540B":
            continue
        shaped = dataclasses.replace(
            run, assumptions=run.assumptions.replace(matmul_model="by shape")
        )
        residual[name] = PB.as_published(shaped)["step_s"] / PB.reported(run)["reported step_s"] - 1
    # Megatron 2022's large runs, flat misses at +18 to +24 %, come within 10 % by shape
    for name in (
        "Korthikanti 530B (selective)",
        "Korthikanti 1T (selective)",
        "Korthikanti 1T (full)",
    ):
        assert abs(residual[name]) < 0.10, residual
    # every dense run within 25 % (the older DeepSpeed stacks ran their kernels slower: -20 to -23 %)
    assert max(map(abs, residual.values())) < 0.25, residual


def test_experts_fold_over_tp_cp_dp_as_megatron_does():
    from course_lib.dims import ParallelDims

    # carved out of dp, as before: ep must divide dp
    with pytest.raises(ValueError, match="ep = 8: expected a divisor of dp = 4: one of 1, 2, 4"):
        ParallelDims(dp=4, tp=2, ep=8)
    # folded with expert-TP 1: the 8 ranks of a stage (tp 2 x dp 4) form one expert group
    d = ParallelDims(dp=4, tp=2, pp=2, ep=8, etp=1)
    assert d.groups("ep") == [list(range(8)), list(range(8, 16))] and d.stride("ep") == 1
    assert [d.coords(r).ep for r in (0, 5, 13)] == [0, 5, 5]
    # expert-TP 2: pairs of neighbours share an expert's width; ep groups 2 apart
    assert ParallelDims(dp=4, tp=2, ep=4, etp=2).groups("ep") == [[0, 2, 4, 6], [1, 3, 5, 7]]
    with pytest.raises(
        ValueError, match="ep = 16, etp = 1: expected ep x etp to divide tp x cp x dp = 8"
    ):
        ParallelDims(dp=4, tp=2, ep=16, etp=1)  # fmt: skip
    # Qwen3-235B-A22B as NVIDIA ran it: EP 32 over TP 2 x DP 16 (VP 4 is not expressible: the
    # planner's uneven split puts 13 layers on a stage)
    q = P.model("Qwen3-235B-A22B")
    lay = P.Layout(16, 2, 8, 1, "selective", 1, 1, ep=32, etp=1)
    assert lay.expert_split == (32, 1)
    mem = P.predict_memory(
        q, lay, global_batch_tokens=2048 * 4096, uneven_stages=True, stage="last"
    )
    carved = P.Layout(16, 2, 8, 1, "selective", 1, 1, ep=16)  # experts over tp x ep = 32 too
    same = P.predict_memory(
        q, carved, global_batch_tokens=2048 * 4096, uneven_stages=True, stage="last"
    )
    assert mem["params"] == same["params"]  # 1/32 of the experts either way, the same ZeRO-1
    g = G.layer_gemms(q, 2, 32, 4096, 4096, True, 1.0, 1)["experts"][0]
    # 4 local experts; 32 ranks x 2,048 tokens x 8 / 128 = 4,096 rows each, the full width
    assert (g.m, g.n, g.batch) == (4096, 2 * 1536, 4)
    result = P.plan(q, P.cluster(H100, gpus=256), global_batch_tokens=2048 * 4096, uneven_stages=True,
                    only={"tp": [2], "pp": [8], "v": [1], "micro_batch": [1], "zero": [1]})  # fmt: skip
    assert ((result.ep == 32) & (result.etp == 1)).any()
