"""The 3-D run (dp 2 × tp 2 × pp 2 on 8 gloo ranks) against one process on the full batch, and
its measured memory and traffic against exact counts."""

import dataclasses

import pytest
import torch

from course_lib.models import GPT
from course_lib.plan import three_d

STEPS, BATCH, M = 2, 8, 2


@pytest.fixture(scope="module")
def result():
    return three_d.run_3d(dp=2, tp=2, pp=2, steps=STEPS, batch=BATCH, microbatches=M)


@pytest.fixture(scope="module")
def reference():
    return three_d.reference_3d(steps=STEPS, batch=BATCH)


@pytest.mark.slow
def test_3d_run_matches_one_process(result, reference):
    par = three_d.parity_3d(result, reference)
    assert par["ok"], par
    assert par["missing"] == []
    # the loss of every step agrees to fp32 rounding; the dp replicas are bit-identical
    for a, b in zip(reference["losses"], result.losses):
        assert a == pytest.approx(b, rel=1e-5)
    assert par["replica_param_diff"] == 0.0
    assert par["max_param_diff"] <= three_d.PARAM_TOL * 1e-3 * STEPS
    # and the parameters really moved, by far more than the tolerance
    torch.manual_seed(0)
    init = dict(GPT(three_d.tiny_config()).named_parameters())
    moved = max((result.params[k] - v).abs().max().item() for k, v in init.items())
    assert moved > 10 * par["param_tolerance"]


def test_parity_catches_a_wrong_parameter(result, reference):
    name = "blocks.0.mlp.c_fc.weight"
    bad = dataclasses.replace(result, params={**result.params, name: result.params[name] + 1e-3})
    par = three_d.parity_3d(bad, reference)
    assert not par["ok"] and par["worst_param"] == "blocks.0.mlp.c_fc.weight"


def test_the_shards_reassemble_the_whole_model(result):
    config = three_d.tiny_config()
    torch.manual_seed(0)
    full = dict(GPT(config).named_parameters())
    assert {k: tuple(v.shape) for k, v in result.params.items()} == {
        k: tuple(v.shape) for k, v in full.items()
    }
    # what a rank holds: its stage, with the blocks' matrices halved by tp
    for r in result.ranks:
        stage = r.coords[0]
        names = [
            k
            for k in full
            if (
                k.startswith(("wte", "wpe", "blocks.0."))
                if stage == 0
                else k.startswith(("blocks.1.", "ln_f", "lm_head"))
            )
        ]
        split = sum(
            full[k].numel()
            for k in names
            if any(s in k for s in ("c_attn", "c_fc")) or k.endswith("c_proj.weight")
        )
        assert r.params_numel == sum(full[k].numel() for k in names) - split // 2


def test_measured_memory_is_the_rank_s_own_state(result):
    for r in result.ranks:
        n = r.params_numel
        tensors = 14 if r.coords[0] == 0 else 15  # parameter tensors of the stage
        assert r.memory["params"] - r.buffer_bytes == 4 * n  # fp32 weights
        assert r.memory["grads"] == 4 * n
        assert r.memory["optimizer"] == 8 * n + 4 * tensors  # Adam's 2 moments + step counters


def test_memory_table_against_the_planner(result):
    table = three_d.memory_table(result)
    assert list(table["stage"]) == [0, 1]
    assert list(table["measured_params_elems"]) == [
        r.params_numel for r in result.ranks if r.coords[1:] == (0, 0)
    ]
    # the planner divides every parameter by tp; the tiny GPT keeps its embeddings, LayerNorms,
    # head and row-layer biases whole on each tp rank, so a rank holds more than predicted
    assert (table["elems_ratio"] > 1).all() and (table["elems_ratio"] < 1.5).all()


def test_traffic_per_rank(result):
    config = three_d.tiny_config()
    act = (BATCH // 2 // M) * config.block_size * config.n_embd * 4  # one (b/m, s, h) fp32 message
    for r in three_d.comm_table(result).to_dict("records"):
        assert r["send"] == r["recv"] == STEPS * M
        assert r["p2p_bytes_sent"] == STEPS * M * act
        tensors = 14 if r["pp"] == 0 else 15
        # tp: 2 all-reduces forward + 2 backward per block per micro-batch; dp: one per
        # gradient tensor per step; one for the step's loss
        assert r["all_reduce"] == STEPS * (4 * M * 1 + tensors + 1)
        if r["wire_bytes_sent"] is not None:
            assert r["wire_bytes_sent"] >= r["model_bytes_sent"] * 0.9


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(pp=3, dp=1, tp=1), "pp = 3"),
        (dict(batch=6), "batch = 6"),
        (dict(tp=3, dp=1, pp=1), "tp = 3"),
    ],
)
def test_bad_layouts_are_refused_before_any_rank_starts(kwargs, message):
    with pytest.raises(ValueError, match=message):
        three_d.run_3d(**kwargs)


def test_the_result_is_typed_and_its_frame_is_one_row_per_rank(result):
    from course_lib.dims import ParallelDims

    assert result.dims == ParallelDims(dp=2, tp=2, pp=2) and result.plan_layout is None
    assert (result.steps, result.batch, result.microbatches) == (STEPS, BATCH, M)
    assert len(result.losses) == STEPS and [r.rank for r in result.ranks] == list(range(8))
    frame = result.to_frame()
    assert list(frame["rank"]) == list(range(8))
    assert [tuple(x) for x in frame[["pp", "dp", "tp"]].to_numpy()] == [
        r.coords for r in result.ranks
    ]
    assert list(frame["params"]) == [r.memory["params"] for r in result.ranks]
    # the old table, built from the ranks as comm_table did before the result was typed
    old = [
        {
            "rank": r.rank,
            "pp": r.coords[0],
            "dp": r.coords[1],
            "tp": r.coords[2],
            "all_reduce": r.calls.get("all_reduce", 0),
            "send": r.calls.get("isend", 0),
            "recv": r.calls.get("recv", 0),
            **{k: r.comm[k] for k in ("p2p_bytes_sent", "model_bytes_sent", "wire_bytes_sent")},
        }
        for r in result.ranks
    ]
    assert three_d.comm_table(result).to_dict("records") == old
    with pytest.raises(TypeError, match="expected the Run3D that three_d.run_3d"):
        three_d.parity_3d(result.as_dict())
