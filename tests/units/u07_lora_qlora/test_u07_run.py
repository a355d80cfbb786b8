"""Unit 07's measured runs: counts, memory of one step, fine-tuning, NF4 bytes, scale, peft."""

from __future__ import annotations

import pytest

from course_lib.measure import estimate
from course_lib.models import GPTConfig
from course_lib.units.u07_lora_qlora import run as R

SMALL = GPTConfig.tiny(n_layer=1, n_embd=32, n_head=2, block_size=16, vocab_size=32)
pytest.importorskip("bitsandbytes")


def test_count_table_is_measured_on_real_modules():
    df = R.count_table(r=8).set_index("model")
    assert (df["residual"] == 0).all()
    assert df.loc["one 4096 x 4096 linear", "measured"] == 65_536
    assert df.loc["Llama-2-7B, q, v", "measured"] == 4_194_304
    assert df.loc["Llama-2-7B, all seven linears", "measured"] == 19_988_480
    assert df.loc["one 4096 x 4096 linear", "percent_of_base"] == pytest.approx(0.39, abs=0.005)


def test_memory_table_grads_and_state_drop_with_lora_and_base_shrinks_with_qlora():
    df = R.memory_table(config=SMALL).set_index("method")
    for col in ("grads", "optimizer", "target_weights"):
        assert (df[col] == df[f"{col}_pred"]).all(), col
    assert df.loc["lora", "grads"] == 4 * df.loc["lora", "trainable"] < df.loc["full", "grads"] / 3
    assert df.loc["qlora", "grads"] == df.loc["lora", "grads"]
    assert df.loc["qlora", "bytes_per_target_param"] == pytest.approx(0.5 + 1 / 64, abs=0.01)
    assert df.loc["lora", "bytes_per_target_param"] == 4.0


def test_lora_reaches_most_of_full_finetunings_drop():
    df = R.finetune(("full", "lora"), steps=60, config=SMALL)
    summary = R.finetune_summary(df)
    assert summary.loc["lora", "trainable"] < summary.loc["full", "trainable"]
    assert (
        summary.loc["full", "first_loss"] == summary.loc["lora", "first_loss"]
    )  # B = 0: same start
    assert summary.loc["lora", "percent_of_full_drop"] > 80
    assert summary.loc["full", "final_loss_vs_full"] == 1.0
    assert summary.loc["lora", "final_loss_vs_full"] >= 1.0


def test_nf4_table_bytes_and_error():
    df = R.nf4_table(shapes=((64, 256),))
    assert (df["measured_bytes"] == df["predicted_bytes"]).all()
    plain, dq = df.iloc[0], df.iloc[1]
    assert plain["scale_bits_per_param"] == 0.5 and plain["bytes_per_param"] == 0.5625
    assert dq["bytes_per_param"] < plain["bytes_per_param"]
    assert 0.05 < dq["rel_rms_error_bnb"] < 0.15
    assert abs(plain["rel_rms_error_ours"] - plain["rel_rms_error_bnb"]) < 1e-6


def test_scale_table_65b_qlora_fits_48gb_and_lora_paper_figures():
    df = R.scale_table()
    q65 = df[
        (df["model"] == "Llama 65B")
        & (df["method"] == "qlora")
        & (df["adapter"] == "r 64, all seven")
    ]
    assert q65["total_GB"].item() < 48
    gpt3 = df[(df["model"] == "GPT-3 175B") & (df["method"] == "lora")]
    assert gpt3["frozen_base_GB"].item() == 350.0
    assert df[df["model"] == "Llama 7B"]["params"].iloc[0] == 6_738_415_616


@pytest.mark.slow
def test_peft_parity_exact():
    pytest.importorskip("peft")
    got = R.peft_parity()
    assert got["max_abs_diff"] == 0.0 and got["max_abs_diff_merged"] == 0.0
    assert (
        got["trainable_ours"]
        == got["trainable_peft"]
        == estimate.lora_params([(64, 192), (64, 64), (64, 256), (256, 64)] * 2, r=8)
    )


def test_bad_arguments():
    with pytest.raises(ValueError, match="method"):
        R.make_finetune_model("prefix")
    with pytest.raises(ValueError, match="methods"):
        R.finetune(["full", "adapters"], steps=1, config=SMALL)
