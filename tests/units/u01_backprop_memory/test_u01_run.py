"""Unit 01: predicted vs measured memory of a training step, and the graded checks."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from course_lib.measure import estimate
from course_lib.models import GPT, MLP, GPTConfig, MLPConfig, count_params
from course_lib.units.u01_backprop_memory import run as u1


def mlp(activation="relu", hidden=(24, 40), bias=True, seed=0):
    torch.manual_seed(seed)
    return MLP(
        MLPConfig(in_features=12, hidden=hidden, out_features=7, activation=activation, bias=bias)
    )


@pytest.mark.parametrize("activation", ["relu", "gelu", "tanh"])
@pytest.mark.parametrize("optimizer", ["sgd", "momentum", "adam"])
def test_mlp_prediction_equals_measurement_exactly(activation, optimizer):
    model = mlp(activation)
    table = u1.compare_step_memory(model, (10,), optimizer)
    model_rows = table[table["category"] != "temporaries"]
    assert (model_rows["residual"] == 0).all(), table
    n = count_params(model)
    got = dict(zip(table["category"], table["measured"]))
    assert got["params"] == got["grads"] == 4 * n
    assert got["optimizer"] == {"sgd": 0, "momentum": 4 * n, "adam": 8 * n + 4 * 6}[optimizer]
    # relu/tanh keep u (10 x 24 + 10 x 40), gelu keeps z too; plus the 10 x 7 output
    per_hidden = 2 if activation == "gelu" else 1
    assert got["activations"] == 4 * 10 * (per_hidden * (24 + 40) + 7)


def test_gpt_residual_is_exactly_the_buffers():
    torch.manual_seed(0)
    model = GPT(GPTConfig.tiny(n_layer=1, n_embd=32, block_size=16))
    table = u1.compare_step_memory(model, (2, 16), "adam").set_index("category")
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    assert table.loc["params", "residual"] == buffers  # causal mask + positions
    assert table.loc["grads", "residual"] == 0
    assert table.loc["optimizer", "residual"] == 0
    assert table.loc["activations", "residual"] == 0
    assert table.loc["activations", "predicted"] == estimate.activation_bytes_gpt(
        model.config, 2, 16
    )


def test_timeline_has_every_phase_and_category():
    timeline, meter = u1.step_timeline(mlp(), (8,), optimizer="adam")
    assert {"forward", "backward", "step"} <= set(timeline["phase"])
    for c in ("params", "grads", "optimizer", "activations", "temporaries", "event", "phase"):
        assert c in timeline.columns
    assert meter.peak_bytes == timeline["total"].max()
    # the step ends with zero_grad(set_to_none=True): no grads, no activations, Adam state stays
    end = timeline.iloc[-1]
    assert end["grads"] == 0 and end["activations"] == 0 and end["optimizer"] > 0


def test_scaling_sweep_model_state_follows_width_activations_follow_batch():
    df = u1.scaling_sweep(batches=(4, 16), widths=(16, 32), in_features=8, depth=1)
    assert (df["residual"] == 0).all()
    piv = df.pivot_table(index=["width", "batch"], columns="category", values="measured")
    for width in (16, 32):
        a4, a16 = piv.loc[(width, 4)], piv.loc[(width, 16)]
        assert a16["activations"] == 4 * a4["activations"]  # linear in batch
        for c in ("params", "grads", "optimizer"):
            assert a16[c] == a4[c]  # independent of batch
    assert piv.loc[(32, 4), "params"] > piv.loc[(16, 4), "params"]


def test_optimizer_state_comparison_counts_states():
    model = mlp()
    df = u1.optimizer_state_comparison(model, (4,)).set_index("optimizer")
    n = count_params(model)
    assert (df["residual"] == 0).all()
    assert df.loc["sgd", "measured"] == 0
    assert df.loc["momentum", "measured"] == 4 * n
    assert df.loc["adam", "measured"] == 8 * n + 4 * len(list(model.parameters()))


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="optimizer = 'lamb': expected one of sgd, momentum, adam"):
        u1.make_optimizer("lamb", mlp())
    with pytest.raises(ValueError, match=r"batch_shape for an MLP is \(batch,\)"):
        u1.make_batch(mlp(), (2, 3))
    with pytest.raises(TypeError, match="MLP or GPT"):
        u1.predict_step_memory(nn.Linear(2, 2), (3,), "sgd")
    with pytest.raises(ValueError, match="optimizer = .*: expected one of"):
        u1.predict_step_memory(mlp(), (3,), "adagrad")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU message")
def test_allocator_demo_needs_cuda():
    with pytest.raises(RuntimeError, match="needs a CUDA device"):
        u1.allocator_demo()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_allocator_keeps_freed_blocks_reserved():
    df = u1.allocator_demo(8 * 2**20).set_index("event")
    freed = df.loc["free (del)"]
    assert freed["reserved"] >= 8 * 2**20 > freed["allocated"] - df.iloc[0]["allocated"]
