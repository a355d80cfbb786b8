"""course_lib.units.u04_optimizer_memory.run: measured optimizer state (exact bytes), the
mixed-precision accounting and the convergence runs."""

from __future__ import annotations

import pytest

from course_lib.measure import estimate
from course_lib.models import GPTConfig
from course_lib.units.u04_optimizer_memory import run as E

SMALL = GPTConfig.tiny(n_layer=1, n_embd=64, n_head=2, block_size=16, vocab_size=64)


def test_state_bytes_table_matches_estimate_exactly_including_8bit():
    df = E.state_bytes_table(config=SMALL, batch=2, seq=8).set_index("optimizer")
    assert list(df.index) == list(E.O.OPTIMIZERS)
    for name in E.O.OPTIMIZERS:
        assert df.loc[name, "residual"] == 0, name
        assert (
            df.loc[name, "measured"] == df.loc[name, "state_total"]
        )  # MemoryMeter == optimizer.state
    for name in ("sgd", "momentum", "rmsprop", "adagrad", "adam", "adamw"):
        assert df.loc[name, "predicted"] == df.loc[name, "naive"], name
    n = df.loc["adam", "n_params"]
    assert df.loc["adam", "moments"] == 8 * n and df.loc["momentum", "moments"] == 4 * n
    # 8-bit Adam: more than the naive 2 B/param (small tensors stay fp32, absmax + code books),
    # far below 8, and exactly estimate.adam8bit_state_bytes of the model's tensors
    r = df.loc["adam8bit"]
    assert r["naive"] == 2 * n and r["measured"] > r["naive"] and r["quant_meta"] > 0
    assert 2.0 < r["bytes_per_param"] < 4.0
    model = E._model(SMALL, 0)
    parts = estimate.adam8bit_state_bytes([p.numel() for p in model.parameters()])
    assert r["measured"] == parts["total"]
    assert r["quant_meta"] == parts["absmax"] + parts["code_books"]


def test_mixed_precision_accounting_is_16_at_rest_and_more_during_the_step():
    df = E.mixed_precision_accounting(config=SMALL, batch=2, seq=8)
    pred, rest, peak = (df.iloc[i] for i in range(3))
    for col in ("params (16-bit)", "grads (16-bit)", "master (fp32)", "adam m, v (fp32)"):
        assert rest[col] == pytest.approx(pred[col]), col
    assert rest["total"] == pytest.approx(pred["total"]) and 16.0 <= rest["total"] < 16.1
    assert peak["fp32 grads + scratch"] >= 4.0  # the fp32 gradients of the master, during the step


def test_accounting_table_reconciles_12_16_18_20():
    df = E.accounting_table()
    assert sorted(set(df["bytes_per_param"])) == [10, 12, 16, 18, 20]
    zero = df.set_index("source").loc["ZeRO, mixed-precision Adam"]
    assert (
        zero["bytes_per_param"]
        == estimate.model_state_bytes(1, precision="fp16-mixed", optimizer="adam")["total"]
    )
    assert df["reference"].str.len().min() > 10


def test_convergence_same_start_and_adam_beats_sgd():
    df = E.convergence(["sgd", "adam", "adam8bit"], steps=12, config=SMALL, batch=4, seq=8)
    first = df[df["step"] == 0].set_index("optimizer")["loss"]
    assert first.nunique() == 1  # same weights, same batch
    last = df[df["step"] == 11].set_index("optimizer")["loss"]
    assert last["adam"] < first["adam"] and last["adam"] < last["sgd"]
    with pytest.raises(ValueError, match="lion"):
        E.convergence(["lion"], steps=1)
    with pytest.raises(ValueError, match="steps = 0: expected an int >= 1"):
        E.convergence(["sgd"], steps=0)


def test_recipe_table_measures_16_12_and_8_bytes_and_the_lost_updates():
    df = E.recipe_table(config=SMALL, batch=2, seq=8, steps=6, lr=1e-4)
    assert list(df.index) == list(E.RECIPES)
    # measured by MemoryMeter, predicted by estimate: equal to the byte (step counters included)
    assert (df["measured B/param"] - df["predicted B/param"]).abs().max() < 1e-12
    assert [round(x) for x in df["measured B/param"]] == [16, 16, 12, 8]
    err = df["update error"]
    assert err["fp32"] == 0
    # without a master copy the small updates are rounded away: far from the fp32 run
    assert err["12 B: bf16, fp32 moments"] > 2 * err["16 B: bf16 + fp32 master"]
    assert (
        df.loc["12 B: bf16, fp32 moments", "unchanged by last step"]
        > df.loc["fp32", "unchanged by last step"]
    )
    with pytest.raises(ValueError, match="steps"):
        E.recipe_table(config=SMALL, steps=1)
