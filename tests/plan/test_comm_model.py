"""The step model's communication terms and the five-dimensional layout, against the formulas
in ``estimate`` they are built from (exact), and the bad input they refuse. Formulas only."""

from __future__ import annotations

import dataclasses

import pytest

from course_lib import plan as P
from course_lib.measure import estimate

H100 = "8xH100 + 400G IB"
NV, IB = 0.8 * 450e9, 50e9  # bytes/s per direction: NVLink 4 at 0.8 of its line rate (NCCL), NDR
A_NV, A_IB = 3.4e-6, 9.6e-6  # NCCL's ring-step latencies


def test_link_latencies_come_from_the_link_table():
    c = P.cluster(H100)
    assert c.alpha_intra_s == pytest.approx(estimate.link_speed("NVLink H100").alpha_us * 1e-6)
    assert c.alpha_inter_s == pytest.approx(estimate.link_speed("InfiniBand NDR").alpha_us * 1e-6)
    assert (c.alpha_intra_s, c.alpha_inter_s) == pytest.approx((A_NV, A_IB))


def test_tp_in_a_node_pays_bandwidth_and_a_latency_per_ring_step():
    m = P.model("Llama-2-70B")
    t = P.step_time(m, P.cluster(H100), P.Layout(1, 8, 1, 1, "selective", 1),
                    global_batch_tokens=4 * 4096)  # fmt: skip
    payload = 2 * 4096 * 8192
    one = 2 * 7 * A_NV + 2 * 7 / 8 * payload / NV
    assert t["tp_comm_s"] == pytest.approx(4 * 80 * 4 * one, rel=1e-12)  # 4 micro-batches
    assert t["latency_s"] == pytest.approx(4 * 80 * 4 * 2 * 7 * A_NV, rel=1e-9)
    bare = P.step_time(m, dataclasses.replace(P.cluster(H100), alpha_intra_s=0.0, alpha_inter_s=0.0),
                       P.Layout(1, 8, 1, 1, "selective", 1), global_batch_tokens=4 * 4096)  # fmt: skip
    assert bare["latency_s"] == 0 and bare["step_s"] < t["step_s"]


def test_tp_across_nodes_is_priced_on_the_network_in_two_levels():
    m, c = P.model("GPT-3-175B"), P.cluster(H100, gpus=16)
    t = P.step_time(m, c, P.Layout(1, 16, 1, 1, "selective", 1), global_batch_tokens=2048)
    payload = 2 * 2048 * 12288
    one = estimate.hierarchical_allreduce_time(payload, nodes=2, gpus_per_node=8, intra_GBps=360,
                                               inter_GBps=50, alpha_intra=A_NV, alpha_inter=A_IB)  # fmt: skip
    assert t["tp_comm_s"] == pytest.approx(96 * 4 * one, rel=1e-12)
    inside = P.step_time(m, c, P.Layout(2, 8, 1, 1, "selective", 1), global_batch_tokens=2 * 2048)
    assert t["tp_comm_s"] > 1.4 * inside["tp_comm_s"]  # the same payload, half of it over IB


@pytest.mark.parametrize("dp, tp, link, alpha", [(1, 2, NV, A_NV), (4, 2, IB, A_IB)])
def test_pipeline_sends_go_over_the_link_between_the_stages(dp, tp, link, alpha):
    m = P.model("Llama-2-7B")
    lay = P.Layout(dp, tp, 2, 1, "selective", 1)
    t = P.step_time(m, P.cluster(H100, gpus=dp * tp * 2), lay, global_batch_tokens=dp * 4 * 4096)
    boundary = estimate.pipeline_boundary_bytes(1, 4096, 4096) / tp
    assert t["p2p_s"] == pytest.approx(4 * 2 * (boundary / link + alpha), rel=1e-12)


def test_overlap_is_a_stated_parameter_per_term():
    m, c, lay = P.model("Llama-2-70B"), P.cluster(H100), P.Layout(1, 8, 1, 1, "selective", 1)
    base = P.step_time(m, c, lay, global_batch_tokens=4096)
    half = P.step_time(
        m, c, lay, global_batch_tokens=4096, assumptions=P.Assumptions(tp_overlap=0.5)
    )
    assert half["tp_comm_s"] == pytest.approx(base["tp_comm_s"] / 2)
    assert set(P.ASSUMPTION_SOURCES) == {f.name for f in dataclasses.fields(P.Assumptions)}
    with pytest.raises(ValueError, match="tp_overlap = 1.5: expected a number <= 1"):
        P.Assumptions(tp_overlap=1.5)
    with pytest.raises(TypeError, match="assumptions = 0.6: expected a plan.Assumptions"):
        P.step_time(m, c, lay, global_batch_tokens=4096, assumptions=0.6)
    fast = P.step_time(m, c, lay, global_batch_tokens=4096, assumptions=P.Assumptions(fp8=True))
    assert fast["compute_s"] < base["compute_s"] and fast["mfu"] > base["mfu"]


def test_context_parallel_traffic_is_unit_15s_bytes_on_the_network():
    m = P.model("Llama-3-405B").replace(seq=131072)
    lay = P.Layout(1, 8, 1, 1, "selective", 1, cp=16)
    c = P.cluster(H100, gpus=128)
    from course_lib.plan import comm_model as cm

    sent = estimate.cp_comm_bytes_per_layer(131072, 1, 16384, 128, 16, kv_heads=8, tp=8,
                                            method="allgather")  # fmt: skip
    steps = 2 * 15  # an all-gather forward, a reduce-scatter backward: 15 ring steps each
    assert cm.cp_comm_s(m, c, lay, 3, 0.0) == pytest.approx(3 * (sent["sent"] / IB + steps * A_IB))
    # each rank keeps 8K tokens' activations: unit 15's count
    mem = P.predict_memory(m, lay, stage="last")
    assert mem["activations"] == 126 * estimate.cp_activation_bytes_per_layer(
        131072, 1, 16384, 128, cp=16, kv_heads=8, ffn=53248, gated_mlp=True, tp=8,
        sequence_parallel=True, method="allgather")  # fmt: skip


def test_moe_models_count_their_experts_with_unit_16s_formulas():
    mix, ds = P.model("Mixtral-8x7B"), P.model("DeepSeek-V3")
    assert mix.n_params == pytest.approx(46.7e9, rel=2e-3)
    assert ds.n_params == pytest.approx(671e9, rel=5e-3)  # MLA priced as multi-head attention
    # active: what a token's products use, plus the embedding lookup: 12.9B (Mistral AI)
    n_active = (mix.flops_per_token()[0] - 12 * 32 * 4096 * 4096) / 6 + 32000 * 4096
    assert n_active == pytest.approx(12.9e9, rel=5e-3)
    moe = estimate.moe_param_count(4096, 14336, 8, top_k=2, gated_mlp=True)
    assert mix.layer_params()["routed"] == 8 * moe["expert"]
    # expert parallelism splits the routed experts' state: twice the ranks, half the bytes
    kw = dict(global_batch_tokens=128 * 4096, stage="last")
    small, big = (
        P.predict_memory(mix, P.Layout(8, 1, 1, 1, "selective", 1, ep=e), **kw) for e in (2, 4)
    )
    routed = 32 * mix.layer_params()["routed"]
    assert small["params"] - big["params"] == 2 * (routed // 2 - routed // 4)


def test_expert_all_to_alls_use_unit_16s_bytes_per_token():
    from course_lib.plan import moe_time

    mix = P.model("Mixtral-8x7B")
    lay = P.Layout(8, 1, 1, 1, "selective", 1, ep=8)
    per_token = estimate.ep_all_to_all_bytes_per_token(4096, ep=8, top_k=2)
    inside = moe_time.all_to_all(mix, P.cluster(H100), lay).total
    assert inside == pytest.approx(4096 * per_token / NV + 4 * A_NV)
    lay16 = P.Layout(16, 1, 1, ep=16)
    across = moe_time.all_to_all(mix, P.cluster(H100, gpus=16), lay16).total
    assert across > 4 * inside  # half the peers are a network hop away


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: P.Layout(4, ep=3), "ep = 3: expected a divisor of dp = 4: one of 1, 2, 4"),
        (lambda: P.Layout(4, grad_bytes=3), "grad_bytes = 3: expected one of 2, 4"),
        (lambda: P.check_layout(P.model("Llama-2-7B"), P.Layout(2, ep=2)),
         "ep = 2: expected a divisor of the 0 experts (a dense model: ep = 1)"),
        (lambda: P.check_layout(P.model("Llama-2-7B"), P.Layout(1, cp=3)),
         "cp = 3: expected a divisor of seq = 4096"),
        (lambda: P.model("Llama-2-7B").replace(experts=8, top_k=9, expert_ffn=1),
         "top_k = 9: expected an int in 1..8"),
    ],
)  # fmt: skip
def test_bad_five_dimensional_input_is_refused(make, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        make()


def test_moe_state_per_rank_is_unit_16s_count():
    """predict_memory's model state of an MoE stage = estimate.moe_model_state_bytes_per_rank
    for the same stage (dense over dp, routed experts over ep and the dp / ep ranks that share
    one)."""
    ds = P.model("DeepSeek-V3")
    lay = P.Layout(128, 1, 16, 1, "selective", 1, ep=64)
    mem = P.predict_memory(ds, lay, global_batch_tokens=15360 * 4096, uneven_stages=True,
                           stage="last")  # fmt: skip
    n = P.stage_layers(ds, 16, uneven_stages=True)[1]
    lp, parts = ds.layer_params(), ds.params()
    dense = n * (lp["moe"] - lp["routed"]) + parts["other"] + parts["output"]
    unit16 = estimate.moe_model_state_bytes_per_rank(dense, n * lp["routed"], ep=64, world_size=128)
    assert mem["params"] + mem["grads"] + mem["optimizer"] == pytest.approx(
        unit16["total"], rel=1e-12
    )
