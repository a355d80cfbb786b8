"""NF4: our code table and quantizer against bitsandbytes; the bytes a Linear4bit stores."""

import pytest
import torch
from torch import nn

from course_lib.measure import estimate
from course_lib.techniques.lora import LoRALinear
from course_lib.techniques.nf4 import dequantize_nf4, nf4_code, quantize_nf4

bnb = pytest.importorskip("bitsandbytes")


def test_code_table_from_normal_quantiles_is_bitsandbytes_table():
    ours = nf4_code()
    theirs = bnb.functional.get_4bit_type("nf4", device="cpu")
    assert ours.shape == (16,) and ours[7] == 0 and ours[0] == -1 and ours[-1] == 1
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6)


def test_our_quantizer_matches_bitsandbytes():
    w = torch.randn(256, 512, generator=torch.Generator().manual_seed(0)) * 0.02
    packed, absmax = quantize_nf4(w)
    q, state = bnb.functional.quantize_4bit(w, blocksize=64, quant_type="nf4")
    assert packed.dtype == torch.uint8 and packed.numel() == w.numel() // 2
    assert torch.equal(absmax, state.absmax)
    # identical codes, except where a value sits on a threshold and rounding differs (none here)
    assert (packed != q.reshape(-1)).float().mean() < 1e-5
    ours = dequantize_nf4(packed, absmax, w.shape)
    torch.testing.assert_close(ours, bnb.functional.dequantize_4bit(q, state), rtol=0, atol=1e-6)
    rel = ((ours - w).pow(2).mean() / w.pow(2).mean()).sqrt()
    assert 0.05 < rel < 0.15  # about 9 % rms error for normal weights


@pytest.mark.parametrize("double_quant", [False, True])
def test_linear4bit_bytes_match_estimate(double_quant):
    from course_lib.techniques.nf4 import nf4_linear, quantized_bytes

    lin = nn.Linear(512, 256, bias=False)
    q = nf4_linear(lin, double_quant=double_quant)
    got = quantized_bytes(q)
    pred = estimate.nf4_bytes(512 * 256, double_quant=double_quant)
    for key in ("codes", "scales", "scales_of_scales"):
        assert got[key] == pred[key], key
    assert got["codes"] == 512 * 256 // 2
    x = torch.randn(4, 512)
    w = bnb.functional.dequantize_4bit(q.weight.data, q.weight.quant_state)
    torch.testing.assert_close(q(x), x @ w.T)


def test_lora_on_a_4bit_base_trains_only_the_adapter():
    from course_lib.techniques.nf4 import nf4_linear

    layer = LoRALinear(nf4_linear(nn.Linear(64, 32)), r=4, alpha=8)
    x = torch.randn(8, 64)
    layer(x).pow(2).mean().backward()
    assert layer.lora_B.grad is not None and layer.base.weight.grad is None
    with pytest.raises(TypeError, match="dequantized before merging"):
        layer.merge()
