"""estimate.lora: counts and bytes against the figures of the LoRA and QLoRA papers."""

import pytest

from course_lib.measure import estimate


def test_lora_counts():
    assert estimate.lora_params([(4096, 4096)], r=8) == 65_536
    llama2_7b = dict(hidden=4096, ffn=11008, layers=32, r=8)
    assert estimate.transformer_lora_params(**llama2_7b) == 4_194_304
    assert estimate.transformer_lora_params(**llama2_7b, targets="all") == 19_988_480
    # GPT-3 175B, r 4 on Wq, Wv (LoRA paper, Sec. 4.2): about 10,000x fewer than 175e9
    gpt3 = estimate.transformer_lora_params(hidden=12288, ffn=4 * 12288, layers=96, r=4)
    assert gpt3 == 18_874_368 and 9000 < 175e9 / gpt3 < 10000


def test_bad_arguments():
    with pytest.raises(
        ValueError, match=r"r = 9: expected r <= min\(d_in, d_out\) = 8 for shapes\[0\]"
    ):
        estimate.lora_params([(8, 16)], r=9)
    with pytest.raises(ValueError, match="targets"):
        estimate.llama_linear_shapes(hidden=8, ffn=16, layers=1, targets=["qkv"])
    with pytest.raises(ValueError, match="lora_params = 0"):
        estimate.finetune_state_bytes(10, method="lora")


def test_nf4_overheads():
    assert estimate.nf4_scale_bits_per_param(double_quant=False) == 0.5
    assert estimate.nf4_scale_bits_per_param() == pytest.approx(0.127, abs=5e-4)
    assert estimate.nf4_bytes(64 * 256)["total"] == 8192 + 256 + 8


def test_finetune_state_bytes():
    n = 7_000_000_000
    full = estimate.finetune_state_bytes(n, method="full")
    assert full["total"] == 16 * n and full["base"] == 0
    lora = estimate.finetune_state_bytes(n, method="lora", lora_params=4_194_304)
    assert lora["base"] == 2 * n and lora["total"] == 2 * n + 16 * 4_194_304
    q = estimate.finetune_state_bytes(n, method="qlora", lora_params=4_194_304)
    assert q["base"] == estimate.nf4_bytes(n)["total"] and q["total"] < lora["total"] / 3
