"""Unit 15's runs: layouts, parity, bytes equal to the estimate, the timeline's balance, the
context-parallel GPT against one process, the Llama 3 table."""

from __future__ import annotations

import pytest

from course_lib.measure import estimate
from course_lib.units.u15_context_parallelism import run


def test_layouts_and_scale_need_no_ranks():
    df = run.layouts(4, 16)
    zig = df[df.layout == "zigzag"]
    assert zig.tokens.iloc[0] == [0, 1, 14, 15] and set(zig.causal_blocks) == {9}
    assert list(df[df.layout == "contiguous"].causal_blocks) == [1, 2, 3, 4]
    scale = run.llama3_scale()
    row = scale[(scale.seq == 131072) & (scale.cp == 16)].iloc[0]
    assert (
        row.tokens_per_rank == 8192
        and row.ulysses_MiB is None
        or row.ulysses_MiB != row.ulysses_MiB
    )
    eight = scale[(scale.seq == 8192) & (scale.cp == 1)].iloc[0]
    assert row.act_flash_GiB == pytest.approx(eight.act_flash_GiB)  # 128K / 16 = 8K per rank
    assert list(run.LLAMA3_TABLE4.cp) == [1, 1, 16]


def test_wire_bytes_equal_the_estimate():
    df = run.wire_bytes((2,))
    assert set(df.method) == {"ring", "allgather", "ulysses"}
    assert (df.sent == df.predicted).all()
    measured = df.dropna(subset=["wire"])
    assert (measured.framing >= 0).all()
    assert (measured.wire <= 1.1 * measured.predicted + 2048).all()


def test_saved_bytes_equal_the_estimate():
    df = run.saved_bytes((32, 64))
    assert (df.residual == 0).all() and len(df) == 4
    ring = df[df.kind.str.startswith("ring")].measured.tolist()
    assert ring[1] == 2 * ring[0]  # linear in s: no score matrix


@pytest.mark.slow
def test_parity_and_training():
    df = run.parity((2,), shape=(1, 4, 4, 32, 8))
    assert df.ok.all() and len(df) == 10  # ring and all-gather in 2 layouts, Ulysses, x 2 masks
    tr = run.train_parity(2, methods=("ring", "ulysses"), steps=2)
    assert (tr.abs_diff < 1e-5).all() and len(tr) == 4


@pytest.mark.slow
def test_timeline_balance():
    tl = run.timeline(4, shape=(1, 2, 2, 64, 8))
    b = run.balance(tl)
    assert (b.blocks == b.predicted_blocks).all()
    assert list(b[b.layout == "contiguous"].blocks) == [1, 2, 3, 4]
    assert set(b[b.layout == "zigzag"].blocks) == {estimate.cp_attention_work(4, rank=0)["blocks"]}
    assert set(tl.kind) == {"compute", "wait"} and set(tl.phase) == {"forward", "backward"}


def test_block_kinds_counted_by_hand():
    from course_lib.units.u15_context_parallelism.run_balance import block_kinds

    # contiguous, 2 ranks: rank 0 its diagonal block only; rank 1 one full block and its diagonal
    assert block_kinds(2, 16, "contiguous") == [
        {"rank": 0, "full": 0, "diagonal": 1},
        {"rank": 1, "full": 1, "diagonal": 1},
    ]
    # zig-zag, 2 ranks (chunks 0,3 and 1,2): each rank 3 full and 2 diagonal half-size blocks
    assert block_kinds(2, 16, "zigzag") == [
        {"rank": 0, "full": 3, "diagonal": 2},
        {"rank": 1, "full": 3, "diagonal": 2},
    ]
    # 4 ranks contiguous: rank r computes r full blocks and one diagonal (r + 1 in all, section 2)
    assert [r["full"] + r["diagonal"] for r in block_kinds(4, 16, "contiguous")] == [1, 2, 3, 4]


def test_block_times_predicts_from_the_measured_block_costs():
    bt = run.block_times(2, shape=(1, 2, 2, 64, 8), repeats=1)
    for row in bt.itertuples():
        assert row.predicted_ms == pytest.approx(
            row.full * row.t_full_ms + row.diagonal * row.t_diag_ms
        )
    assert set(bt.block_tokens) == {32, 16}  # contiguous s/W, zig-zag s/2W
    assert bt.groupby("layout").predicted_vs_busiest.max().tolist() == [1.0, 1.0]


@pytest.mark.slow
def test_ring_overlap_runs_and_predicts_from_its_measured_link():
    points, summary = run.ring_overlap((64, 128), width=64, flops=(1e11, 2e11), repeats=1)
    assert len(points) == 4 and set(points.x) == {64, 128}
    assert (points.bytes == 2 * points.x * 64 * 4).all()  # K and V, fp32
    assert points.compute_s.tolist() == pytest.approx(
        (4 * points.x**2 * 64 / points.speed).tolist()
    )
    # full multi-head attention in fp32: n* = (F/B) d p / (2 d) = 2 F / B, at the measured B
    assert summary.formula.tolist() == pytest.approx(
        (2 * summary.speed / summary.bytes_per_s).tolist()
    )
    assert list(summary.speed) == [1e11, 2e11]
