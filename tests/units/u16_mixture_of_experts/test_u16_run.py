"""Unit 16's runs: parameters counted = predicted, parity with one process, bytes equal to the
estimate, a hot expert's rank does the work, training shows collapse, the scale table."""

from __future__ import annotations

import pytest

from course_lib.units.u16_mixture_of_experts import run


def test_params_and_scale_need_no_ranks():
    p = run.params()
    assert (p.counted == p.predicted).all()
    s = run.scale()
    mix, ds = s.iloc[0], s.iloc[1]
    assert round(mix.total_B, 1) == 46.7 and round(mix.active_B, 1) == 12.9
    assert round(ds.total_B) == 671 and 37 <= ds.active_B < 38
    assert run.architecture_params("DeepSeek-V3")["experts"] == 58 * 256 * 3 * 7168 * 2048


def test_wire_bytes_two_ranks():
    w = run.wire_bytes((2,))
    assert (w.sent == w.predicted).all()
    measured = w.dropna(subset=["wire"])
    assert (measured.framing % 144 == 0).all() and (measured.framing > 0).all()


# Parity at 1, 2 and 4 ranks (drops included), the ep x dp mesh and the hot-expert imbalance on the
# timeline are checked once per `make test`, by lecture 16's compared cells (nbval), not again here.
@pytest.mark.slow
def test_balancing_keeps_the_busiest_expert_below_its_unbalanced_share():
    tr = run.train(steps=60)
    last = tr[tr.step >= 50].groupby("balancing").busiest_share.mean()
    assert last["none"] > 0.9 and last["aux_loss"] < 0.8 and last["bias"] < 0.6


def test_imbalance_counts_the_rows_of_the_repeat_the_timeline_plot_draws():
    import pandas as pd

    from course_lib.units.u16_mixture_of_experts import plots

    rows = [
        {"hot": 0.0, "repeat": rep, "rank": rank, "phase": phase, "start": 0.0, "end": 1e-3,
         "rows": (100 + rep) * (rank + 1)}
        for rep in (0, 1, 2) for rank in (0, 1) for phase in ("route", "experts", "combine")
    ]  # fmt: skip
    tl = pd.DataFrame(rows)
    imb = run.imbalance(tl)
    assert list(imb.expert_rows) == [102, 204]  # the last repeat's
    fig = plots.plot_timeline(tl)
    labels = {t.get_text().strip() for ax in fig.axes for t in ax.texts}
    assert {"102 rows", "204 rows"} <= labels


def test_train_seed_draws_other_weights_and_tokens():
    base = run.train(("none",), steps=3)
    again = run.train(("none",), steps=3, seed=0)
    other = run.train(("none",), steps=3, seed=1)
    assert base.task_loss.tolist() == again.task_loss.tolist()
    assert base.task_loss.tolist() != other.task_loss.tolist()
    with pytest.raises(ValueError, match="seed = -1"):
        run.train(("none",), steps=3, seed=-1)


def test_narrowest_hiding_expert_by_hand():
    """f > (F/B) (ep - 1)/ep p / 2 with no latency: F = 0.25 PFLOP/s, B = 1 GB/s, ep = 2, fp32:
    250 x 1/2 x 4 / 2 = 250, strictly above: 251 (at 250 the bytes take exactly the compute's
    time and the estimate says inf); twice the speed, 501."""
    from course_lib.units.u16_mixture_of_experts.run_overlap import narrowest_hiding_expert

    kw = dict(hidden=256, experts=4, ep=2, link_GBps=1.0, tokens=4096, dtype_bytes=4)
    assert narrowest_hiding_expert(peak_flops=0.25e12, **kw) == 251
    assert narrowest_hiding_expert(peak_flops=0.5e12, **kw) == 501


def test_a2a_overlap_refuses_uneven_splits():
    with pytest.raises(ValueError, match="experts = 3"):
        run.a2a_overlap(experts=3)
    with pytest.raises(ValueError, match="widths"):
        run.a2a_overlap(widths=(0, 8))


@pytest.mark.slow
def test_a2a_overlap_on_two_ranks():
    """Real dispatch and combine on 2 ranks: the bytes are the same at every width, and the
    widest experts hide more of them than the narrowest."""
    points, summary = run.a2a_overlap((64, 2048), tokens_per_expert=512, repeats=3)
    assert list(summary.speed) == [0.25e12, 0.5e12] and (summary.formula > 0).all()
    for _, g in points.groupby("speed"):
        assert g.bytes.nunique() == 1 and g.ratio.iloc[-1] < g.ratio.iloc[0]
