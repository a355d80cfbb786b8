"""course_lib.units.u03_mixed_precision.run: measured runs on a small GPT, exact where bytes are."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from course_lib.measure import estimate
from course_lib.models import GPT, GPTConfig, count_params
from course_lib.units.u03_mixed_precision import run as E

SMALL = GPTConfig.tiny(n_layer=1, n_embd=32, n_head=2, block_size=16, vocab_size=32)


def test_format_table_and_rounding_table():
    t = E.format_table()
    assert list(t.index) == ["fp32", "bf16", "fp16", "fp8_e5m2", "fp8_e4m3"]
    assert t.loc["bf16", "exponent_bits"] == t.loc["fp32", "exponent_bits"] == 8
    r = E.rounding_table([1e-8, 7e4], ["fp16", "bf16"]).set_index(["value", "format"])
    assert r.loc[(1e-8, "fp16"), "underflow"] and not r.loc[(1e-8, "bf16"), "underflow"]
    assert r.loc[(7e4, "fp16"), "overflow"] and not r.loc[(7e4, "bf16"), "overflow"]
    with pytest.raises(ValueError, match="fp64"):
        E.rounding_table([1.0], ["fp64"])


def test_permutation_task_is_course_lib_data_s():
    # the task lives in course_lib.data (tested there); unit 03 re-exports it
    from course_lib import data

    assert E.permutation_batch is data.permutation_batch
    idx, tgt = E.permutation_batch(SMALL, 4, 8, generator=torch.Generator().manual_seed(3))
    assert idx.shape == tgt.shape == (4, 8) and int(idx.max()) < SMALL.vocab_size


def test_underflow_fractions_shift_with_the_scale():
    g = E.gradient_histogram(config=SMALL, batch=2, seq=8)
    assert g.dtype == torch.float32 and bool((g > 0).all())
    df = E.underflow_fractions(g, scales=(1.0, 2.0**16)).set_index(["format", "scale"])
    assert df.loc[("bf16", 1.0), "zero"] == 0.0
    assert df.loc[("fp16", 2.0**16), "zero"] <= df.loc[("fp16", 1.0), "zero"]
    assert df.loc[("fp16", 2.0**16), "subnormal"] < df.loc[("fp16", 1.0), "subnormal"]
    # hand-made: values below fp16's smallest subnormal are zero, exactly
    df = E.underflow_fractions(torch.tensor([1e-9, 1e-3, 1e5]), scales=(1.0,), formats=("fp16",))
    assert df.loc[0, "zero"] == pytest.approx(1 / 3) and df.loc[0, "inf"] == pytest.approx(1 / 3)


def test_tiny_updates_vanish_in_bf16_but_not_with_a_master_copy():
    df = E.tiny_updates(weight=1.0, update=1e-3, steps=50).set_index("recipe")
    assert df.loc["bf16", "final"] == 1.0  # every update rounded away
    assert df.loc["fp32", "rel_error"] < 1e-5
    assert df.loc["bf16 + fp32 master", "rel_error"] < 4e-3  # only the final bf16 rounding
    with pytest.raises(ValueError, match="steps = 0: expected an int >= 1"):
        E.tiny_updates(steps=0)


def test_training_memory_state_is_exact_and_residuals_are_the_buffers():
    df = E.training_memory(
        ["fp32", "bf16-true", "bf16-mixed"], config=SMALL, batch=2, seq=8, device="cpu"
    )
    m = df.set_index(["mode", "category"])
    model = GPT(SMALL)
    n, buffers = count_params(model), sum(b.numel() * b.element_size() for b in model.buffers())
    for mode in ("fp32", "bf16-true"):
        pred = estimate.model_state_bytes(
            n, precision=mode, optimizer="adam", n_param_tensors=len(list(model.parameters()))
        )
        assert m.loc[(mode, "grads"), "measured"] == pred["grads"]
        assert m.loc[(mode, "optimizer"), "measured"] == pred["optimizer"]
        assert m.loc[(mode, "params"), "residual"] == buffers  # causal masks + positions
        assert (
            m.loc[(mode, "activations"), "residual"] == 0
        )  # estimate.activation_bytes_gpt is exact
    # autocast keeps fp32 parameters and fp32 gradients: the 16-bit copies are transient
    assert m.loc[("bf16-mixed", "params"), "measured"] == 4 * n + buffers
    assert m.loc[("bf16-mixed", "grads"), "measured"] == 4 * n
    # ... and their casts (bf16 weight copies, fp32 ops such as layer_norm) are extra activations
    assert m.loc[("bf16-mixed", "activations"), "residual"] > 0
    assert set(df["category"]) == {"params", "grads", "optimizer", "activations", "peak"}
    assert (df["residual"] == df["measured"] - df["predicted"]).all()


def test_matmul_speed_columns_and_bad_input():
    df = E.matmul_speed([32], ["fp32", "bf16"], warmup=0, repeat=1, device="cpu")
    assert list(df["dtype"]) == ["fp32", "bf16"] and (df["gflops"] > 0).all()
    assert df.loc[0, "gflops"] == pytest.approx(
        estimate.matmul_flops(32, 32, 32) / df.loc[0, "median_s"] / 1e9
    )
    with pytest.raises(ValueError, match="fp8"):
        E.matmul_speed([32], ["fp8_e4m3"], device="cpu")
    with pytest.raises(ValueError, match="sizes"):
        E.matmul_speed([0], device="cpu")
    with pytest.raises(ValueError, match="cpu_threads = 0: expected an int >= 1"):
        E.matmul_speed([8], cpu_threads=0, device="cpu")
    threads = torch.get_num_threads()
    E.matmul_speed([8], ["fp32"], warmup=0, repeat=1, device="cpu", cpu_threads=1)
    assert torch.get_num_threads() == threads  # restored


def test_loss_curves_same_start_and_fp16_skips_with_a_huge_scale():
    df = E.loss_curves(
        ["fp32", "fp16-mixed"],
        steps=4,
        config=SMALL,
        batch=2,
        seq=8,
        init_scale=2.0**40,
        device="cpu",
    )
    assert isinstance(df, pd.DataFrame) and len(df) == 8
    first = df[df["step"] == 0].set_index("mode")["loss"]
    assert first["fp32"] == pytest.approx(first["fp16-mixed"], rel=1e-2)
    fp16 = df[df["mode"] == "fp16-mixed"]
    assert fp16["skipped"].iloc[0] and fp16["scale"].iloc[1] == 2.0**39  # backoff after the skip
    assert not df[df["mode"] == "fp32"]["skipped"].any()
    assert (df["seconds"] > 0).all()  # every step is timed
    with pytest.raises(ValueError, match="mode = 'fp64': expected one of"):
        E.loss_curves(["fp64"], steps=1, config=SMALL)
