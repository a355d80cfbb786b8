"""techniques.flash: the online softmax, and the tiled attention at parity with PyTorch's SDPA in
value and gradients (causal and not, odd lengths, one block and many), what it saves for
backward, its memory growing linearly in a measured sweep, and its refusals of bad input."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from course_lib.measure.memory import MemoryMeter
from course_lib.techniques import flash


def _qkv(n, *, b=2, h=3, d=8, n_k=None, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, n, d, generator=g, dtype=dtype)
    k, v = (torch.randn(b, h, n if n_k is None else n_k, d, generator=g, dtype=dtype) for _ in "kv")
    return [t.requires_grad_() for t in (q, k, v)]


def test_online_softmax_matches_softmax_hand_checked_and_large():
    # log(e^1 + e^2 + e^3) = 3 + log(1 + e^-1 + e^-2), by hand
    x = torch.tensor([[1.0, 2.0, 3.0]], dtype=torch.float64)
    want = 3 + torch.log(torch.tensor(1 + torch.e**-1 + torch.e**-2, dtype=torch.float64))
    for b in (1, 2, 3, 64):
        assert torch.allclose(flash.online_logsumexp(x, block_size=b), want.reshape(1), atol=1e-15)
    big = torch.randn(5, 301, dtype=torch.float64) * 300  # exp overflows without the max
    assert torch.allclose(
        flash.online_softmax(big, block_size=7), torch.softmax(big, -1), atol=1e-14
    )
    assert torch.allclose(flash.online_logsumexp(big, block_size=7), torch.logsumexp(big, -1))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("n", "block"), [(1, 4), (5, 64), (37, 8), (64, 16), (33, 1)])
def test_parity_with_sdpa_forward_and_gradients(causal, n, block):
    q, k, v = _qkv(n)
    out = flash.flash_attention(q, k, v, causal=causal, block_size=block)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    assert torch.allclose(out, ref, rtol=0, atol=1e-12)
    dout = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), dout)
    want = torch.autograd.grad(ref, (q, k, v), dout)
    for name, a, b in zip("qkv", got, want):
        assert torch.allclose(a, b, rtol=0, atol=1e-12), name


def test_more_keys_than_queries_and_gradcheck():
    q, k, v = _qkv(7, n_k=19)
    out = flash.flash_attention(q, k, v, block_size=4)
    assert torch.allclose(out, F.scaled_dot_product_attention(q, k, v), atol=1e-12)
    small = _qkv(6, b=1, h=1, d=3)
    assert torch.autograd.gradcheck(
        lambda *t: flash.flash_attention(*t, causal=True, block_size=4), small
    )


def test_naive_attention_is_the_quadratic_comparator():
    q, k, v = _qkv(11)
    for causal in (False, True):
        ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        assert torch.allclose(flash.naive_attention(q, k, v, causal=causal), ref, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_lower_precisions_keep_their_dtype_and_stay_close(dtype):
    q, k, v = _qkv(20, dtype=dtype)
    out = flash.flash_attention(q, k, v, causal=True, block_size=8)
    out.float().sum().backward()
    assert out.dtype == dtype and q.grad is not None and q.grad.dtype == dtype
    ref = F.scaled_dot_product_attention(*(t.detach().double() for t in (q, k, v)), is_causal=True)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert torch.allclose(out.double(), ref, atol=tol)


def test_saves_only_inputs_output_and_one_lse_per_row():
    q, k, v = _qkv(50, dtype=torch.float32)
    out = flash.flash_attention(q, k, v, causal=True, block_size=8)
    saved = out.grad_fn.saved_tensors
    assert [tuple(t.shape) for t in saved] == [(2, 3, 50, 8)] * 4 + [(2, 3, 50)]
    assert all(t.shape[-1] != 50 or t.dim() == 3 for t in saved)  # no (50, 50) tensor


def test_memory_grows_linearly_in_a_measured_sweep():
    """Peak bytes of forward + backward (MemoryMeter): each doubling of the sequence adds exactly
    twice the previous step for the tiled attention (a + b s), while the written-out attention's
    saved bytes grow nearly fourfold."""
    peaks, naive = [], []
    for n in (64, 128, 256):
        q, k, v = _qkv(n, b=1, h=2, d=16, dtype=torch.float32)
        dout = torch.randn(1, 2, n, 16)
        with MemoryMeter(track=(q, k, v, dout)) as mem:
            flash.flash_attention(q, k, v, causal=True, block_size=32).backward(dout)
        peaks.append(mem.peak_bytes)
        with MemoryMeter(track=(q, k, v)) as fwd:
            out = flash.naive_attention(q, k, v, causal=True)
        naive.append(fwd.end_breakdown["activations"])
        del out
    assert peaks[2] - peaks[1] == 2 * (peaks[1] - peaks[0]) > 0
    assert naive[2] / naive[1] > 3.5 and naive[1] / naive[0] > 3.3


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (
            lambda q: flash.flash_attention(q, q, q, block_size=0),
            ValueError,
            "block_size = 0: expected an int >= 1",
        ),
        (lambda q: flash.flash_attention(q, q, q, block_size=2.5), TypeError, "block_size = 2.5"),
        (
            lambda q: flash.flash_attention(q[0], q, q),
            ValueError,
            r"q.shape = \(2, 8, 4\): expected 4",
        ),
        (
            lambda q: flash.flash_attention(q, q.double(), q),
            TypeError,
            "k.dtype, v.dtype = torch.float64",
        ),
        (
            lambda q: flash.flash_attention(q.long(), q, q),
            TypeError,
            "q.dtype = torch.int64: expected one of",
        ),
        (
            lambda q: flash.flash_attention(q, q[:, :1], q[:, :1]),
            ValueError,
            r"k.shape, v.shape = \(1, 1",
        ),
        (
            lambda q: flash.flash_attention(q, q[:, :, :3], q[:, :, :3], causal=True),
            ValueError,
            "k.shape.2. = 3",
        ),
        (
            lambda q: flash.flash_attention(q, q, q, causal=1),
            TypeError,
            "causal = 1: expected True or False",
        ),
        (lambda q: flash.flash_attention(q, q, "v"), TypeError, "v = 'v': expected a torch.Tensor"),
        (lambda q: flash.online_softmax(q.long()), TypeError, "x = "),
    ],
)
def test_bad_input_is_refused_with_a_clear_message(call, error, message):
    with pytest.raises(error, match=message):
        call(torch.zeros(1, 2, 8, 4))
