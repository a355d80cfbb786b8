"""Unit 14's tables: the sources' numbers recomputed, the published runs, the scale tables."""

from __future__ import annotations

import pytest

from course_lib.units.u14_planning_a_run import run as R


def test_sources_budget():
    t = R.sources_budget().set_index("quantity")["value"]
    assert t["FLOPs, 175B x 300B tokens"] == 315 * 10**21
    assert [round(t[f"{g} for 30 days at 50 % MFU"]) for g in ("V100", "A100", "H100")] == [
        1944,
        779,
        246,
    ]
    assert t["FLOPs, 7B x 2T tokens"] == 84 * 10**21
    assert t["H100-hours at 50 % MFU"] == pytest.approx(47_186, rel=1e-3)
    assert 0.38 < t["Llama-2-7B: MFU implied by 184,320 A100-hours"] < 0.40
    assert t["80 GB GPUs to hold it"] == 35


@pytest.mark.slow
def test_published_runs_beside_the_planners_best():
    """Replaces the three-run version: every large run beside the planner's best for the same
    model, GPUs and batch. A published layout that fits and is more than NEAR behind the best
    is explained (R.DISAGREEMENTS, the lecture's section 2.3), and no explanation is stale."""
    from course_lib.plan import published

    t = R.published_runs().set_index("run")
    assert set(R.BEST_SEARCH) <= set(t.index)
    searched = t.loc[list(R.BEST_SEARCH)]
    assert searched["best step_s"].notna().all()
    assert searched["best step_s"].le(searched["predicted step_s"] + 1e-9).sum() >= 5
    fits = searched[~searched.index.isin(list(published.MEMORY_MISSES))]
    behind = set(fits.index[fits["published vs best"] > R.NEAR])
    assert behind == set(R.DISAGREEMENTS), fits["published vs best"].round(3).to_dict()
    # the 128K plan splits the sequence, the MoE plan its experts
    assert "CP16" in t.loc["Llama 3 405B, 128K, 16,384 GPUs", "planner's best"]
    assert " EP" in t.loc["DeepSeek-V3", "planner's best"]


def test_decision_numbers():
    d = R.decision_numbers()
    assert d["dp_alone_max_params_B"] == 5.0
    assert [d[f"zero{s}_7b_on_8_GB"] for s in range(4)] == [112.0, 38.5, 26.25, 14.0]
    assert d["tp16_comm_share"] > 2 * d["tp8_comm_share"]  # TP across nodes costs
    assert d["bubble_p8_m32"] == pytest.approx(7 / 39)
    assert d["full_70b_state_GB"] > d["node_memory_GB"] > d["lora_70b_state_GB"]
    assert d["grads_70b_fp32_GB"] == 2 * d["grads_70b_GB"]


def test_scale_tables():
    f = R.failures_at_scale()
    assert f.iloc[-1]["failures per day"] == pytest.approx(419 / 54)
    assert f.iloc[-1]["hours between failures"] == pytest.approx(54 * 24 / 419)
    c = R.checkpoint_cost()
    assert c["size_TB"] == pytest.approx(14 * 405.853e9 / 1e12, rel=1e-4)
    assert c["interval_min"] == pytest.approx((2 * c["write_s"] * c["mtbf_h"] * 3600) ** 0.5 / 60)
    s = R.straggler_table()
    assert s.iloc[-1]["P(step is slow)"] == pytest.approx(1 - (1 - 1e-5) ** 16384)


def test_plan_problems_reference():
    from course_lib import plan as P

    m, c = P.model("Llama-2-70B"), P.cluster("8xH100 + 400G IB", gpus=64)
    assert R.plan_problems(m, c, P.Layout(4, 16, 1), 1024 * 4096) == {"tp_across_nodes"}
    assert R.plan_problems(m, c, P.Layout(8, 8, 1), 1024 * 4096) == set()
