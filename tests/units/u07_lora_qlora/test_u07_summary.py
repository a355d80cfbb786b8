"""Unit 07's technique summary (S0 §5.4.9 with measured numbers): each effect in the direction
physics says, exact bytes where they are exact, and bad input."""

from __future__ import annotations

import pytest
from torch import nn

from course_lib.models import GPT, GPTConfig
from course_lib.units.u07_lora_qlora import run as R

pytest.importorskip("bitsandbytes")


@pytest.fixture(scope="module")
def table():
    return R.technique_summary(rounds=3).set_index("technique")


@pytest.fixture(scope="module")
def tiny():
    """Counted here, independently of the table: parameters, parameter tensors, and the linears
    that get adapters."""
    model = GPT(GPTConfig.tiny())
    targets = [
        m
        for n, m in model.named_modules()
        if isinstance(m, nn.Linear) and n.rsplit(".", 1)[-1] in R.GPT_TARGETS
    ]
    params = list(model.parameters())
    return {"n": sum(p.numel() for p in params), "tensors": len(params), "adapted": len(targets)}


def test_one_row_per_technique_with_the_words_and_the_baseline_at_one(table):
    assert tuple(table.index) == R.TECHNIQUES
    base = table.loc["baseline"]
    assert base["peak_vs_base"] == 1.0 and base["time_per_example_vs_base"] == 1.0
    for col in ("setting", "benefit", "cost"):  # shown whole at pandas' default column width
        assert table[col].str.len().between(1, 50).all(), col
    assert table[["peak_vs_base", "time_per_example_vs_base"]].notna().all().all()


def test_batch_size_moves_activations_not_model_state(table, tiny):
    big, base, small = (table.loc[t] for t in ("larger batch", "baseline", "smaller batch"))
    assert big["peak_B"] > base["peak_B"] > small["peak_B"]
    assert big["activation_peak_B"] > base["activation_peak_B"] > small["activation_peak_B"]
    for col in ("weights_B", "grads_B", "optimizer_B"):
        assert big[col] == base[col] == small[col], col
    assert base["weights_B"] == base["grads_B"] == 4 * tiny["n"]  # fp32
    assert base["optimizer_B"] == 8 * tiny["n"] + 4 * tiny["tensors"]  # m, v + step counters
    # per example, a larger batch is no slower (noisy shared cores: loose bounds only)
    assert big["time_per_example_vs_base"] < 1.25
    assert big["time_per_example_vs_base"] < small["time_per_example_vs_base"]


def test_accumulation_keeps_a_micro_batchs_memory_for_a_k_times_larger_batch(table):
    acc, base, big = (table.loc[t] for t in ("gradient accumulation", "baseline", "larger batch"))
    assert "effective batch 32" in acc["setting"]
    assert abs(acc["activation_peak_B"] - base["activation_peak_B"]) < 0.05 * base["peak_B"]
    assert acc["peak_B"] < 1.2 * base["peak_B"] < 0.5 * big["peak_B"]


def test_bf16_halves_weights_grads_and_moments_and_mixed_keeps_fp32_state(table, tiny):
    bf16, base = table.loc["reduced precision (bf16)"], table.loc["baseline"]
    counters = 4 * tiny["tensors"]  # torch.optim's fp32 step counters, one per tensor
    assert 2 * bf16["weights_B"] == base["weights_B"]
    assert 2 * bf16["grads_B"] == base["grads_B"]
    assert 2 * (bf16["optimizer_B"] - counters) == base["optimizer_B"] - counters
    assert bf16["peak_B"] < base["peak_B"]
    mixed = table.loc["mixed precision (bf16)"]
    for col in ("weights_B", "grads_B", "optimizer_B"):
        assert mixed[col] == base[col], col


def test_momentum_keeps_one_state_tensor_per_parameter(table, tiny):
    sgd = table.loc["less-stateful optimizer"]
    assert sgd["optimizer_B"] == 4 * tiny["n"]  # one fp32 buffer, no step counter
    assert sgd["peak_B"] < table.loc["baseline", "peak_B"]


def test_offload_moves_the_optimizer_off_the_device(table, tiny):
    off, base = table.loc["CPU offload"], table.loc["baseline"]
    assert off["optimizer_B"] == 0
    assert off["weights_B"] == base["weights_B"]
    # the host: fp32 master + fp32 grads + m + v, and one step counter per tensor
    assert off["host_B"] == 16 * tiny["n"] + 4 * tiny["tensors"]
    assert off["peak_B"] < base["peak_B"]
    assert "unit 05" in off["note"] and "PCIe" in off["note"]


def test_checkpointing_lowers_the_activation_peak_only(table):
    ck, base = table.loc["activation checkpointing"], table.loc["baseline"]
    assert ck["activation_peak_B"] < base["activation_peak_B"]
    for col in ("weights_B", "grads_B", "optimizer_B"):
        assert ck[col] == base[col], col


def test_lora_trains_what_count_table_counts_and_only_that_has_state(table, tiny):
    counts = R.count_table(r=8).set_index("model").loc["tiny GPT (this unit)"]
    lora, qlora = table.loc["LoRA"], table.loc["QLoRA"]
    assert lora["trainable"] == qlora["trainable"] == counts["measured"]
    assert lora["trainable_pct"] == pytest.approx(counts["percent_of_base"], rel=1e-12)
    k, adapter_tensors = lora["trainable"], 2 * tiny["adapted"]  # A and B per adapted linear
    assert lora["grads_B"] == qlora["grads_B"] == 4 * k
    assert lora["optimizer_B"] == qlora["optimizer_B"] == 8 * k + 4 * adapter_tensors
    assert lora["weights_B"] == table.loc["baseline", "weights_B"] + 4 * k  # frozen base + A, B
    assert qlora["weights_B"] < lora["weights_B"] / 2  # NF4 codes: half a byte per weight
    assert table.loc["baseline", "trainable_pct"] == 100.0


@pytest.mark.parametrize(
    "kwargs, exc, words",
    [
        ({"batch": 6}, ValueError, ["batch = 6", "factor = 4"]),
        ({"factor": 1}, ValueError, ["factor = 1"]),
        ({"seq": 65}, ValueError, ["seq = 65", "1..64"]),
        ({"r": 0}, ValueError, ["r = 0"]),
        ({"rounds": 0}, ValueError, ["rounds = 0"]),
        ({"batch": 2.5}, TypeError, ["batch = 2.5"]),
        ({"config": "tiny"}, TypeError, ["config = ", "GPTConfig"]),
    ],
)
def test_bad_input_names_the_parameter_and_what_is_valid(kwargs, exc, words):
    with pytest.raises(exc) as err:
        R.technique_summary(**kwargs)
    for w in words:
        assert w in str(err.value)
