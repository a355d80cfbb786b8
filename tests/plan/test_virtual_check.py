"""The planner's per-rank model state against PyTorch's FSDP2 / DTensor on the virtual cluster
(two cut models of 1 and 2 layers at the real width; about 3-6 s per layout)."""

import pytest

from course_lib import plan as P
from course_lib.plan.virtual_check import TOLERANCE, compare_with_virtual


def _rows(df):
    return df.set_index("part")


@pytest.mark.slow
def test_7b_fsdp_per_layer_and_rest_agree():
    # the top plan of notebooks/14 for Llama-2-7B on 8 GPUs: dp 8, ZeRO-3
    df = _rows(
        compare_with_virtual(P.model("Llama-2-7B"), P.Layout(dp=8, zero=3, recompute="none"))
    )
    assert abs(df.at["per layer", "ratio"] - 1) <= TOLERANCE
    assert abs(df.at["rest", "ratio"] - 1) <= TOLERANCE
    # the per-layer residual is Adam's 4-byte step counter of each of the 9 tensors, nothing else
    assert df.at["per layer", "residual_B"] == 9 * 4


@pytest.mark.slow
def test_70b_fsdp_tp_per_layer_agrees_and_rest_is_replicated_over_tp():
    # the top plan of notebooks/14 for Llama-2-70B on 64 GPUs: dp 32 x tp 2, ZeRO-3
    layout = P.Layout(dp=32, tp=2, zero=3)
    df = _rows(compare_with_virtual(P.model("Llama-2-70B"), layout))
    assert abs(df.at["per layer", "ratio"] - 1) <= TOLERANCE
    # the two RMSNorm weights (2 h) stay whole on each tp rank: h extra params, 16 B, over dp
    h = 8192
    assert df.at["per layer", "residual_B"] == 9 * 4 + h * 16 // layout.dp
    # DTensor's plan leaves the embedding and output replicated over tp: twice the planner's
    assert df.at["rest", "ratio"] == pytest.approx(2.0, rel=TOLERANCE)


def test_refuses_layouts_it_cannot_simulate():
    m = P.model("Llama-2-7B")
    with pytest.raises(ValueError, match="zero = 1"):
        compare_with_virtual(m, P.Layout(dp=8, zero=1))
    with pytest.raises(ValueError, match="pp = 2"):
        compare_with_virtual(m, P.Layout(dp=4, pp=2, zero=3))
    with pytest.raises(ValueError, match="gated_mlp"):
        compare_with_virtual(P.model("GPT-3-175B"), P.Layout(dp=8, zero=3))


def test_the_sequence_is_named_seq_and_seq_len_still_works_one_release(monkeypatch):
    from course_lib.plan import virtual_check

    seen = []

    def stop(model, layout, layers, *, seq, timeout):
        seen.append(seq)
        raise RuntimeError("no simulation in this test")

    monkeypatch.setattr(virtual_check, "_simulate", stop)
    m, lay = P.model("Llama-2-7B"), P.Layout(dp=8, zero=3, recompute="none")
    for kw, want in (({}, 128), ({"seq": 64}, 64), ({"seq_len": 32}, 32)):
        with pytest.raises(RuntimeError, match="no simulation"):
            compare_with_virtual(m, lay, **kw)
        assert seen.pop() == want
    with pytest.raises(TypeError, match="seq = 64, seq_len = 32"):
        compare_with_virtual(m, lay, seq=64, seq_len=32)
    with pytest.raises(ValueError, match="seq_len = 0"):
        compare_with_virtual(m, lay, seq_len=0)
    assert not seen  # both refused before any simulation
