"""FP8 casts, the scaled matmul and Float8Linear (course_lib.techniques.fp8, fp8_linear)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from course_lib.techniques.fp8 import (
    SCALINGS,
    fp8_matmul,
    relative_error,
    scaled_mm_available,
    to_float8,
)
from course_lib.techniques.fp8_linear import (
    RECIPES,
    Float8Linear,
    convert_to_float8,
    float8_layers,
)


def _x(seed=0, shape=(64, 256)):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("scaling", SCALINGS)
def test_cast_round_trip_and_scale_shapes(scaling):
    x = _x()
    q = to_float8(x, scaling=scaling, block=128)
    shapes = {"tensorwise": (1, 1), "rowwise": (64, 1), "blockwise": (64, 2)}
    assert tuple(q.scale.shape) == shapes[scaling]
    assert q.data.dtype == torch.float8_e4m3fn and q.data.shape == x.shape
    # 3 mantissa bits: the rounding error of a value is at most 2^-4 of it (normal range)
    assert relative_error(q.dequantize(), x) < 0.04
    # the largest |value| of each group lands exactly on 448
    assert float(q.data.float().abs().max()) == 448.0
    assert q.nbytes() == x.numel() + 4 * q.scale.numel()


def test_blockwise_weight_blocks_and_int_block():
    w = _x(1, (256, 256))
    q = to_float8(w, scaling="blockwise", block=(128, 128))
    assert tuple(q.scale.shape) == (2, 2)
    assert tuple(to_float8(w, scaling="blockwise", block=64).scale.shape) == (256, 4)


def test_outlier_column_blockwise_confines_it():
    x = _x(2)
    x[:, 3] *= 1e5  # in every row: the others fall into the subnormals of one tensor scale
    keep = torch.arange(256) != 3
    err = {
        s: relative_error(to_float8(x, scaling=s, block=32).dequantize()[:, keep], x[:, keep])
        for s in SCALINGS
    }
    # each row's amax is its own outlier (a little smaller than the tensor's): rowwise helps a
    # little; a 1 x 32 tile confines the outlier to 31 neighbours
    assert err["blockwise"] < 0.5 * err["rowwise"] and err["rowwise"] < err["tensorwise"]


def test_zero_tensor_nonzero_scale_and_bad_inputs():
    q = to_float8(torch.zeros(4, 8))
    assert float(q.scale) > 0 and not q.dequantize().any()
    for bad in (float("inf"), float("nan")):
        x = torch.ones(4, 8)
        x[1, 2] = bad
        with pytest.raises(
            ValueError, match="x = a tensor with inf or NaN: expected finite values"
        ):
            to_float8(x)
    with pytest.raises(ValueError, match=r"^scale = 0.0: expected finite values > 0"):
        to_float8(torch.ones(4, 8), scale=0.0)
    with pytest.raises(ValueError, match=r"^block = \(1, 128\): expected it to divide"):
        to_float8(torch.ones(4, 100), scaling="blockwise", block=128)
    with pytest.raises(ValueError, match=r"^scaling = 'columnwise': expected one of"):
        to_float8(torch.ones(4, 8), scaling="columnwise")
    with pytest.raises(ValueError, match=r"^dtype = 'e3m4': expected one of e4m3, e5m2"):
        to_float8(torch.ones(4, 8), dtype="e3m4")
    with pytest.raises(TypeError, match=r"^x = tensor\(\[1, 2\]\): expected a floating-point"):
        to_float8(torch.tensor([1, 2]))


def test_given_scale_saturates():
    x = torch.tensor([[1.0, 10.0, 1000.0]])
    q = to_float8(x, scale=1.0)  # 1000 is beyond 448 x 1
    assert q.data.float().tolist() == [[1.0, 10.0, 448.0]]
    assert to_float8(torch.tensor([[1e5]]), dtype="e5m2", scale=1.0).data.float().item() == 57344.0


@pytest.mark.parametrize("scaling", ["tensorwise", "rowwise"])
def test_scaled_mm_matches_fp32_product_of_dequantised_operands(scaling):
    if not scaled_mm_available("cpu", scaling):  # torch 2.11's CPU kernel: tensorwise only
        assert (
            fp8_matmul(
                to_float8(_x(0, (4, 16)), scaling=scaling),
                to_float8(_x(1, (4, 16)), scaling=scaling),
            )[1]
            == "emulated"
        )
        pytest.skip(f"torch._scaled_mm with {scaling} scales does not run on this CPU build")
    a, b = _x(3, (32, 128)), _x(4, (48, 128))
    qa, qb = to_float8(a, scaling=scaling), to_float8(b, scaling=scaling)
    kernel, how = fp8_matmul(qa, qb)
    emulated, how2 = fp8_matmul(qa, qb, emulate=True)
    assert (how, how2) == ("_scaled_mm", "emulated")
    torch.testing.assert_close(kernel, emulated, rtol=1e-6, atol=1e-5)  # bitwise on torch 2.13 CPU
    assert (
        fp8_matmul(to_float8(a, scaling="blockwise"), to_float8(b, scaling="blockwise"))[1]
        == "emulated"
    )


def test_fp8_matmul_refuses_mismatched_shapes():
    with pytest.raises(ValueError, match="expected .M, K. and .N, K. with the same K"):
        fp8_matmul(to_float8(_x(0, (4, 16))), to_float8(_x(1, (4, 32))))


@pytest.mark.parametrize("recipe", [r for r in RECIPES if r != "unscaled"])
def test_float8_linear_forward_backward_against_fp32(recipe):
    torch.manual_seed(0)
    lin = nn.Linear(128, 256)
    layer = Float8Linear.from_linear(lin, recipe=recipe, block=32)
    assert layer.weight is lin.weight and layer.bias is lin.bias  # master weight shared
    x = _x(5, (2, 64, 128))
    dy = _x(6, (2, 64, 256)) * 1e-3
    xs = [x.clone().requires_grad_(True) for _ in range(2)]
    outs = []
    for mod, xi in ((lin, xs[0]), (layer, xs[1])):
        lin.weight.grad = lin.bias.grad = None
        y = mod(xi)
        y.backward(dy)
        outs.append((y.detach(), xi.grad, lin.weight.grad.clone(), lin.bias.grad.clone()))
    (y0, dx0, dw0, db0), (y1, dx1, dw1, db1) = outs
    assert relative_error(y1, y0) < 0.08
    assert relative_error(dx1, dx0) < 0.12
    assert relative_error(dw1, dw0) < 0.12
    torch.testing.assert_close(db1, db0)  # the bias stays in high precision
    assert layer.gemm in ("_scaled_mm", "emulated")
    assert lin.weight.dtype == torch.float32


def test_float8_linear_bad_input():
    with pytest.raises(ValueError, match=r"^in_features = 100: expected a multiple of block = 32"):
        Float8Linear.from_linear(nn.Linear(100, 64), recipe="blockwise", block=32)
    with pytest.raises(ValueError, match=r"^recipe = 'mxfp8': expected one of"):
        Float8Linear.from_linear(nn.Linear(16, 16), recipe="mxfp8")
    with pytest.raises(TypeError, match="expected an nn.Linear"):
        Float8Linear.from_linear(nn.Conv1d(4, 4, 1))


def test_delayed_scaling_saturates_after_a_spike_and_keeps_a_bounded_history():
    from dataclasses import replace

    torch.manual_seed(0)
    layer = Float8Linear.from_linear(
        nn.Linear(32, 32), recipe=replace(RECIPES["delayed"], history=4)
    )
    with torch.no_grad():
        for _ in range(6):
            layer(torch.randn(16, 32))
        assert layer.saturated["input"] == 0 and len(layer.amax_history["input"]) == 4
        layer(torch.randn(16, 32) * 50)  # the history has not seen it: clamped at 448 x scale
        assert layer.saturated["input"] > 0


def test_convert_skips_the_head_and_trains():
    from course_lib.models import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig.tiny(n_embd=64, block_size=16, bias=False, tie_weights=False))
    convert_to_float8(model, recipe="tensorwise")
    names = set(float8_layers(model))
    assert "lm_head" not in names and len(names) == 8 and isinstance(model.lm_head, nn.Linear)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    idx = torch.randint(0, 65, (8, 16), generator=torch.Generator().manual_seed(1))
    losses = []
    for _ in range(8):
        loss = model.loss(idx, torch.roll(idx, -1, 1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < losses[0] - 0.3
    with pytest.raises(ValueError, match="no nn.Linear of GPT is left"):
        convert_to_float8(GPT(GPTConfig.tiny()), skip=["lm_head", "c_attn", "c_proj", "c_fc"])


@pytest.mark.parametrize("shape", [(16, 32, 64), (64, 128, 32)], ids=["16x32x64", "64x128x32"])
def test_tensorwise_recipe_agrees_with_torchaos_float8_training(shape):
    # torchao's Float8Linear (dynamic tensorwise scales: E4M3 input and weight, E5M2 gradient)
    # runs on the CPU through torch._scaled_mm; the course's recipe is the same arithmetic, so the
    # output and both gradients agree to fp32 rounding (the GEMMs accumulate in another order).
    import copy
    import warnings

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import torchao.float8 as float8
    except Exception as exc:  # noqa: BLE001 - absent, or built for another torch (the floor's)
        pytest.skip(f"torchao's float8 training does not import here: {exc}")
    from course_lib.techniques.fp8_linear import Float8Linear

    torch.manual_seed(0)
    batch, n_in, n_out = shape
    linear = torch.nn.Linear(n_in, n_out, bias=False)
    theirs = torch.nn.Sequential(copy.deepcopy(linear))
    float8.convert_to_float8_training(theirs)
    assert type(theirs[0]).__name__ == "Float8Linear"
    ours = Float8Linear.from_linear(copy.deepcopy(linear), recipe="tensorwise")
    x, grad = torch.randn(batch, n_in) * 3, torch.randn(batch, n_out)
    x_theirs, x_ours = x.clone().requires_grad_(), x.clone().requires_grad_()
    y_theirs, y_ours = theirs(x_theirs), ours(x_ours)
    y_theirs.backward(grad)
    y_ours.backward(grad)
    for a, b in [
        (y_ours, y_theirs),
        (x_ours.grad, x_theirs.grad),
        (ours.weight.grad, theirs[0].weight.grad),
    ]:
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5 * b.abs().max().item())
    # and FP8 is not a no-op: both differ from the fp32 layer by the same cast error
    assert not torch.allclose(y_ours, linear(x), rtol=1e-4, atol=0)


def test_a_kernel_that_takes_a_slow_path_is_emulated(monkeypatch):
    """On some CPUs torch's tensorwise kernel is ~60x slower than the rowwise one: the product
    is then emulated (the dequantised fp32 product), which the probe decides once."""
    import time

    from course_lib.techniques import fp8

    real = torch._scaled_mm

    def slow(*args, **kwargs):
        time.sleep(0.05)
        return real(*args, **kwargs)

    monkeypatch.setattr(fp8, "_SCALED_MM", {})
    monkeypatch.setattr(torch, "_scaled_mm", slow)
    assert not fp8.scaled_mm_available("cpu", "rowwise")
    qa, qb = (to_float8(_x(i, (8, 32)), scaling="rowwise") for i in (5, 6))
    assert fp8_matmul(qa, qb)[1] == "emulated"
