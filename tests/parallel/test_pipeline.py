"""parallel.pipeline: schedules, split and refusals (pure), and one step of every schedule on 4
real gloo ranks against one process and against torch.distributed.pipelining."""

from __future__ import annotations

import pandas as pd
import pytest

from course_lib.measure import estimate as E
from course_lib.parallel import pipeline as P


def test_split_and_bad_splits():
    assert P.split_layers(8, 4) == [range(0, 2), range(2, 4), range(4, 6), range(6, 8)]
    assert P.split_layers(7, 3, sizes=[3, 2, 2]) == [range(0, 3), range(3, 5), range(5, 7)]
    with pytest.raises(ValueError, match=r"n_layers = 6: expected a multiple of stages = 4"):
        P.split_layers(6, 4)
    with pytest.raises(ValueError, match=r"sizes = \[3, 2\]: expected 3 stage sizes adding up"):
        P.split_layers(7, 3, sizes=[3, 2])
    with pytest.raises(ValueError, match=r"adding up to n_layers = 7 \(they add up to 6\)"):
        P.split_layers(7, 3, sizes=[2, 2, 2])


def test_bad_configs_refused_before_launch():
    ok = dict(n_layers=8, ranks=4, microbatches=8, batch_rows=16)
    assert len(P.check_pipeline("1f1b", **ok)) == 4
    with pytest.raises(ValueError, match=r"microbatches = 2: expected at least ranks = 4 for 1f1b"):
        P.check_pipeline("1f1b", **{**ok, "microbatches": 2, "batch_rows": 4})
    with pytest.raises(
        ValueError, match=r"batch_rows = 10: expected a multiple of microbatches = 8"
    ):
        P.check_pipeline("gpipe", **{**ok, "batch_rows": 10})
    with pytest.raises(ValueError, match=r"microbatches = 6: expected a multiple of ranks = 4"):
        P.check_pipeline("interleaved", **{**ok, "microbatches": 6, "batch_rows": 12}, virtual=2)
    with pytest.raises(ValueError, match=r"schedule = 'zb': expected one of naive, gpipe"):
        P.check_pipeline("zb", **ok)
    with pytest.raises(ValueError, match=r"virtual = 2: only the interleaved schedule"):
        P.check_pipeline("gpipe", **ok, virtual=2)
    assert P.check_pipeline("gpipe", **{**ok, "microbatches": 2, "batch_rows": 4})  # allowed


def test_one_f_one_b_order_and_memory_bound():
    names = lambda acts: [f"{a.kind}{a.microbatch}" for a in acts]  # noqa: E731
    assert names(P.one_f_one_b_order(0, 4, 8)) == [
        "F0",
        "F1",
        "F2",
        "F3",
        "B0",
        "F4",
        "B1",
        "F5",
        "B2",
        "F6",
        "B3",
        "F7",
        "B4",
        "B5",
        "B6",
        "B7",
    ]
    assert names(P.one_f_one_b_order(3, 4, 8))[:4] == ["F0", "B0", "F1", "B1"]
    for s in range(4):  # at most p - s forwards waiting for their backward
        held, peak = 0, 0
        for a in P.one_f_one_b_order(s, 4, 8):
            held += 1 if a.kind == "F" else -1
            peak = max(peak, held)
        assert peak == 4 - s


@pytest.mark.parametrize(
    "name,p,m,v",
    [
        ("gpipe", 4, 8, 1),
        ("1f1b", 4, 8, 1),
        ("1f1b", 3, 5, 1),
        ("interleaved", 4, 8, 2),
        ("interleaved", 2, 4, 3),
        ("interleaved", 4, 4, 2),
    ],
)
def test_replayed_bubble_matches_formula(name, p, m, v):
    split = P.split_layers(p * v * 2, p * v)
    spans = pd.DataFrame(P.replay([P.schedule_order(name, r, p, m, v) for r in range(p)], split))
    idle = P.bubble_from_events(spans.assign(lane="compute"))
    assert sum(idle.values()) / p == pytest.approx(E.pipeline_bubble_fraction(p, m, v))


def test_naive_idles_p_minus_1_over_p_and_deadlock_is_reported():
    split = P.split_layers(4, 4)
    spans = pd.DataFrame(P.replay([P.naive_order(r, 4, 3) for r in range(4)], split))
    assert sum(P.bubble_from_events(spans.assign(lane="compute")).values()) / 4 == pytest.approx(
        3 / 4
    )
    bad = [P.gpipe_order(0, 2, 2), list(reversed(P.gpipe_order(1, 2, 2)))]
    with pytest.raises(RuntimeError, match="deadlock"):
        P.replay(bad, P.split_layers(2, 2))


def test_estimate_sources_numbers():
    assert E.microbatches_for_bubble(4, 0.1) == 28
    assert E.microbatches_for_bubble(4, 0.1, definition="ratio") == 31
    assert (
        E.microbatches_for_bubble(8, 0.1),
        E.microbatches_for_bubble(8, 0.1, definition="ratio"),
    ) == (64, 71)
    assert E.pipeline_boundary_bytes(2, 2048, 4096) == 32 * 2**20
    assert 1 - E.pipeline_bubble_fraction(4, 8) == pytest.approx(8 / 11)
    assert E.pipeline_messages(4, 8) == 48 and E.pipeline_messages(4, 8, 2) == 112


@pytest.mark.slow
def test_every_schedule_equals_one_process_and_torch():
    """One step, float64, 8 blocks: ours (4 schedules) and torch's ScheduleGPipe and
    Schedule1F1B and ScheduleInterleaved1F1B on the same split (2 ranks: the lecture runs 4), each
    against one process on the full batch (the harness
    tolerance; measured worst 3e-11 of it)."""
    from course_lib.units.u12_pipeline_parallelism import run

    df = run.parity(("naive", "gpipe", "1f1b", "interleaved"), ranks=2, steps=1, microbatches=2)
    assert set(zip(df.implementation, df.schedule)) >= {
        ("torch", "gpipe"),
        ("torch", "1f1b"),
        ("course", "interleaved"),
    }
    assert df.ok.all(), df
