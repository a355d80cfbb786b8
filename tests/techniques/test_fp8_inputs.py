"""FP8 on empty and wrong inputs (issue 47, item 4): ``to_float8`` and ``fp8_matmul`` give
empty results for empty tensors under every scaling, ``Float8Linear`` maps a 0-row batch to a
0-row output with a backward of zeros under every recipe, and a wrong input is refused with a
message naming ``in_features``, the value and the width expected (delayed scaling's amax
history is left as it was)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from course_lib.techniques.fp8 import SCALINGS, fp8_matmul, to_float8
from course_lib.techniques.fp8_linear import RECIPES, Float8Linear

EMPTY = [(0, 16), (2, 0, 16), (4, 0), (0,), (0, 0)]


@pytest.mark.parametrize("scaling", SCALINGS)
@pytest.mark.parametrize("shape", EMPTY)
def test_empty_tensor_casts_to_an_empty_one(scaling, shape):
    x = torch.zeros(shape)
    for scale in (None, 1.0):
        q = to_float8(x, scaling=scaling, block=16, scale=scale)
        assert q.data.shape == x.shape and q.data.dtype == torch.float8_e4m3fn
        assert q.dequantize().shape == x.shape
        assert torch.isfinite(q.scale).all() and (q.scale > 0).all()
    if scaling == "tensorwise":  # still one scale for the whole tensor
        assert q.scale.shape == (1, 1)


@pytest.mark.parametrize("scaling", ["tensorwise", "rowwise"])
def test_product_with_an_empty_operand_is_zeros(scaling):
    a, b = torch.randn(3, 16), torch.randn(5, 16)
    for x, w, want in ((a[:0], b, (0, 5)), (a, b[:0], (3, 0)), (a[:, :0], b[:, :0], (3, 5))):
        out, how = fp8_matmul(to_float8(x, scaling=scaling), to_float8(w, scaling=scaling))
        assert out.shape == want and not out.any() and how == "emulated"


@pytest.mark.parametrize("recipe", list(RECIPES))
@pytest.mark.parametrize("shape", [(0, 128), (2, 0, 128)])
def test_float8_linear_empty_batch_forward_and_backward(recipe, shape):
    torch.manual_seed(0)
    layer = Float8Linear.from_linear(nn.Linear(128, 128), recipe=recipe)
    x = torch.zeros(shape, requires_grad=True)
    y = layer(x)
    assert y.shape == (*shape[:-1], 128)
    (y.sum() + 0 * layer.weight.sum()).backward()
    assert x.grad is not None and x.grad.shape == x.shape
    assert layer.weight.grad is not None and not layer.weight.grad.any()
    assert layer.bias is not None and layer.bias.grad is not None and not layer.bias.grad.any()
    y2 = layer(torch.randn(4, 128))  # the layer still works afterwards
    assert y2.shape == (4, 128) and torch.isfinite(y2).all()


def test_float8_linear_wrong_input_names_in_features():
    layer = Float8Linear.from_linear(nn.Linear(16, 8), recipe="tensorwise")
    for shape in ((3, 17), (3, 32), (2, 3, 15), (0, 4)):
        want = (
            rf"^x.shape = \({', '.join(map(str, shape))}\): expected \(\.\.\., 16\), a last "
            rf"dimension of in_features = 16 \(got {shape[-1]}\)$"
        )
        with pytest.raises(ValueError, match=want):
            layer(torch.zeros(shape))
    with pytest.raises(
        ValueError, match=r"x.shape = \(\): expected .* in_features = 16 \(got none"
    ):
        layer(torch.tensor(1.0))
    with pytest.raises(TypeError, match=r"^x.dtype = torch.int64: expected a floating-point"):
        layer(torch.zeros(3, 16, dtype=torch.long))
    with pytest.raises(TypeError, match=r"^x = \[1.0, .*: expected a tensor \(\.\.\., 16\)"):
        layer([1.0] * 16)


def test_delayed_history_untouched_by_a_refused_input():
    layer = Float8Linear.from_linear(nn.Linear(16, 8), recipe="delayed")
    layer(torch.ones(2, 16))
    before = {k: list(v) for k, v in layer.amax_history.items()}
    with pytest.raises(ValueError, match="x = a tensor with inf or NaN"):
        layer(torch.full((2, 16), float("inf")))
    assert layer.amax_history == before
    assert torch.isfinite(layer(torch.ones(2, 16))).all()
