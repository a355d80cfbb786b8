"""The planner's overlap thresholds (plan.thresholds, estimate.overlap at a layout's sizes) and
the sentence explain() says with them, against values worked by hand."""

from __future__ import annotations

import math

import pytest

from course_lib import plan as P
from course_lib.plan.thresholds import layout_thresholds, threshold_clause

H100 = "8xH100 + 400G IB"
F = 989e12 * 0.6  # dense bf16 peak x the default matmul efficiency


def test_llama3_128k_thresholds_by_hand():
    m = P.model("Llama-3-405B").replace(seq=131072)
    lay = P.Layout(8, 8, 16, 1, "selective", 1, 4, cp=16)
    t = layout_thresholds(m, P.cluster(H100, gpus=16384), lay, global_batch_tokens=128 * 131072)
    rows = {(r.parallelism, r.quantity): r for r in t.itertuples()}
    # DP over dp x cp = 128 ranks, one a node (tp 8 fills it): one port, F/B (N-1)/N
    dp = rows["DP", "tokens per GPU"]
    assert dp.link == "network" and dp.has == 8192
    assert dp.needs == pytest.approx(F / 50e9 * 127 / 128) and not dp.hides  # 11,775.5
    # TP 8 on NVLink (0.8 x 450 GB/s, what NCCL reaches) with 8,192 tokens and alpha 3.4 us: the root of
    # 24 T h^2/(8 F) = 4 x 7 alpha + 4 x 7 T h 2/(8 B)
    a, b, c = 24 * 8192 / (8 * F), 4 * 7 * 8192 * 2 / (8 * 360e9), 4 * 7 * 3.4e-6
    tp = rows["TP", "hidden size"]
    assert tp.needs == pytest.approx((b + math.sqrt(b * b + 4 * a * c)) / (2 * a)) and tp.hides
    # 16 micro-batches; (15)/(4m + 15) < 0.05 needs m > 15 x 0.95 / 0.2 = 71.25
    bubble = rows["PP", "micro-batches"]
    assert (bubble.has, bubble.needs, bubble.hides) == (16, 72, False)
    # a stage of 126 // 16 = 7 layers over one port: (F/B) 2 / (24 x 7 x 16,384)
    p2p = rows["PP", "transfer / compute"]
    assert p2p.has == pytest.approx(F / 50e9 * 2 / (24 * 7 * 16384)) and p2p.hides
    # ring, causal, 16 query and 1 K/V head a rank: 2 (F/B) / 16 = 1,483.5 < 8,192 tokens a rank
    cp = rows["CP", "tokens per rank"]
    assert cp.link == "network" and cp.has == 8192
    assert cp.needs == pytest.approx(2 * F / 50e9 / 16) and cp.hides


def test_a_data_parallel_group_filling_a_node_uses_its_ports():
    # Llama-2-7B, dp 16 over two nodes: eight ranks a node all-reduce over eight ports
    t = layout_thresholds(
        P.model("Llama-2-7B"), P.cluster(H100, gpus=16), P.Layout(16, zero=3),
        global_batch_tokens=64 * 4096,
    )  # fmt: skip
    (row,) = t.itertuples()
    assert (row.parallelism, row.link, row.has) == ("FSDP", "network (8 ports)", 4096)
    assert row.needs == pytest.approx(F / 400e9 * 15 / 16) and row.hides  # 1,390.7


def test_an_expert_parallel_row():
    m = P.model("DeepSeek-V3")
    lay = P.Layout(64, 1, 16, 1, "selective", 1, 1, ep=64)
    t = layout_thresholds(m, P.cluster(H100, gpus=1024), lay, global_batch_tokens=4096 * 4096)
    ep = t[t.parallelism == "EP"].iloc[0]
    # 4,096 tokens a rank, top 8 of 256 experts, ep 64: 64 x 4,096 x 8 / 256 tokens an expert;
    # across nodes each row's transfer (F/B) 2 (63/64) 2 h outweighs 6 h f = 6 x 2,048 h
    assert ep.has == 64 * 4096 * 8 / 256 and ep.link == "network"
    assert F / 50e9 * 4 * 63 / 64 > 6 * 2048 and ep.needs == math.inf and not ep.hides
    assert threshold_clause(ep) == (
        "EP on network: tokens per expert 8,192, at no size does it fit behind its compute: "
        "communication-bound"
    )


def test_explain_says_why_a_layout_is_communication_bound():
    mt = P.model("MT-NLG-530B")
    result = P.plan(mt, P.cluster("8xA100-80GB + 200G IB", gpus=2240),
                    global_batch_tokens=1920 * 2048, allow_tp_across_nodes=True,
                    only={"zero": [1], "recompute": ["selective"]})  # fmt: skip
    text = P.explain(result, families=12)
    # tp 16 spans two nodes: h >= (F/B) (t-1) 2 / 6 plus latency, A100: 312e12 x 0.6 / 25e9
    bound = 312e12 * 0.6 / 25e9 * 15 * 2 / 6
    line = next(x for x in text.splitlines() if x.startswith("- TP 16 x PP 7"))
    assert "TP on network: hidden size 20,480, below the 38,355 at which it would fit" in line
    assert line.endswith("communication-bound.") and bound == pytest.approx(37440)  # < 38,355
    assert "Its communication against the thresholds (estimate.overlap): DP on network" in text


def test_explain_says_when_the_step_model_does_not_overlap_what_could_hide():
    result = P.plan(
        P.model("Llama-2-7B"), P.cluster(H100), global_batch_tokens=4 * 2**20, total_tokens=2e12
    )
    line = next(x for x in P.explain(result).splitlines() if x.startswith("- TP 2 x PP 1"))
    assert "TP on NVLink: hidden size 4,096, at least the 672 at which it fits" in line
    assert line.endswith("yet the step model overlaps none of it (tp_overlap = 0).")


def test_threshold_clause_refuses_other_rows():
    with pytest.raises(ValueError, match=r"row = \{'tp': 1\}: expected a row of layout_thresholds"):
        threshold_clause({"tp": 1})
