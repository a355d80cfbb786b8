"""course_lib.techniques.optim: the from-scratch Adam against torch.optim, the optimizers of the
unit, and their state in bytes (exact)."""

from __future__ import annotations

import pytest
import torch

from course_lib.measure import estimate
from course_lib.techniques import optim as O


def _run(opt_factory, steps=6, dtype=torch.float32):
    gen = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(s, generator=gen).to(dtype)) for s in ((12, 7), (7,))]
    opt = opt_factory(params)
    for t in range(steps):
        g = torch.Generator().manual_seed(10 + t)
        for p in params:
            p.grad = torch.randn(p.shape, generator=g).to(dtype)
        opt.step()
    return [p.detach() for p in params], opt


@pytest.mark.parametrize(
    "wd, decoupled, ref",
    [
        (0.0, False, torch.optim.Adam),
        (0.1, False, torch.optim.Adam),
        (0.1, True, torch.optim.AdamW),
    ],
)
def test_adam_is_bit_identical_to_torch_single_tensor_path(wd, decoupled, ref):
    kw = dict(lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=wd)
    ours, _ = _run(lambda ps: O.Adam(ps, decoupled=decoupled, **kw))
    theirs, _ = _run(lambda ps: ref(ps, foreach=False, **kw))
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=0, atol=0)  # same order of operations


def test_adam_skips_params_without_grad_and_validates():
    p, q = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(3))
    opt = O.Adam([p, q], lr=0.1)
    p.grad = torch.ones(3)
    opt.step()
    assert q not in opt.state and torch.equal(q.detach(), torch.ones(3))
    with pytest.raises(ValueError, match="betas"):
        O.Adam([p], betas=(0.9, 1.0))
    with pytest.raises(ValueError, match="lr = -1: expected a number >= 0"):
        O.Adam([p], lr=-1)


def test_state_bytes_of_our_adam_is_exactly_8_per_fp32_param_and_4_per_bf16():
    for dtype, per in ((torch.float32, 8), (torch.bfloat16, 4)):
        _, opt = _run(lambda ps: O.Adam(ps, lr=1e-3), steps=1, dtype=dtype)
        sb = O.state_bytes(opt)
        assert sb == {"moments": per * (84 + 7), "step": 0, "quant_meta": 0, "total": per * 91}


def test_adam_with_fp32_state_on_bf16_params_is_the_rounded_fp32_step():
    # the 12-byte recipe: fp32 moments, the update computed in fp32 and rounded once into bf16
    torch.manual_seed(0)
    w = torch.randn(64, 32)
    p16, p32 = (
        torch.nn.Parameter(w.to(torch.bfloat16)),
        torch.nn.Parameter(w.to(torch.bfloat16).float()),
    )
    opt16 = O.Adam([p16], lr=1e-2, state_dtype=torch.float32)
    opt32 = torch.optim.Adam([p32], lr=1e-2, foreach=False)
    g = torch.randn(64, 32)
    p16.grad, p32.grad = g.to(torch.bfloat16), g.to(torch.bfloat16).float()
    opt16.step()
    opt32.step()
    assert p16.dtype == torch.bfloat16 and torch.equal(
        p16.detach(), p32.detach().to(torch.bfloat16)
    )
    assert O.state_bytes(opt16)["moments"] == 8 * 64 * 32  # fp32 m and v
    with pytest.raises(ValueError, match="state_dtype"):
        O.Adam([p16], state_dtype=torch.int8)


# every optimizer of the unit: state bytes of a model whose tensors are all >= 4096 elements
# (8-bit) or all small (kept in 32 bits by bitsandbytes), exact
@pytest.mark.parametrize("name", O.OPTIMIZERS)
def test_state_bytes_match_estimate_exactly(name):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(128, 64, bias=False), torch.nn.Linear(64, 64, bias=False)
    )
    opt = O.make_optimizer(name, model.parameters(), lr=1e-3)
    model(torch.randn(2, 128)).sum().backward()
    opt.step()
    n, k = 128 * 64 + 64 * 64, 2
    sb = O.state_bytes(opt)
    pred = estimate.model_state_bytes(n, precision="fp32", optimizer=name, n_param_tensors=k)[
        "optimizer"
    ]
    if name == "adam8bit":
        assert sb["moments"] == pred == 2 * n
        # per-block absmax (fp32 per 256 values, per moment) + the two shared 256-entry code books
        assert sb["quant_meta"] == 2 * 4 * (n // 256) + 2 * 256 * 4
        assert sb["step"] == 0  # bitsandbytes keeps an int step
    else:
        assert sb["total"] == pred
        assert sb["step"] == (4 * k if name in ("rmsprop", "adagrad", "adam", "adamw") else 0)


def test_adam8bit_keeps_small_tensors_in_32_bits():
    small = torch.nn.Parameter(torch.randn(100))
    opt = O.make_optimizer("adam8bit", [small], lr=1e-3)
    small.grad = torch.randn(100)
    opt.step()
    assert O.state_bytes(opt)["moments"] == 2 * 4 * 100  # below min_8bit_size=4096: fp32 state


def test_adam8bit_tracks_adam():
    def train(name):
        torch.manual_seed(0)
        model = torch.nn.Linear(64, 64)
        opt = O.make_optimizer(name, model.parameters(), lr=1e-2)
        x = torch.randn(32, 64, generator=torch.Generator().manual_seed(1))
        for _ in range(20):
            opt.zero_grad()
            loss = (model(x) - x).pow(2).mean()
            loss.backward()
            opt.step()
        return float(loss.detach())

    a, b = train("adam"), train("adam8bit")
    assert abs(a - b) < 0.05 * a  # 8-bit moments: close, not equal


def test_make_optimizer_and_state_bytes_bad_input():
    p = [torch.nn.Parameter(torch.ones(2))]
    with pytest.raises(
        ValueError, match="name = 'lion'.*sgd, momentum, rmsprop, adagrad, adam, adamw, adam8bit"
    ):
        O.make_optimizer("lion", p, lr=1e-3)
    with pytest.raises(ValueError, match="lr = 0"):
        O.make_optimizer("sgd", p, lr=0)
    with pytest.raises(TypeError, match="optimizer = .*: expected a torch.optim.Optimizer"):
        O.state_bytes({"state": {}})
    # a module where the parameters or the optimizer go: once "'Linear' object is not iterable"
    # or "'Linear' object has no attribute 'step'"
    layer = torch.nn.Linear(2, 3)
    with pytest.raises(TypeError) as info:
        O.make_optimizer("adam", layer, lr=1e-3)
    assert str(info.value) == (
        "params = Linear(in_features=2, out_features=3, bias=True): expected the tensors to "
        "optimize, e.g. model.parameters()"
    )
    from course_lib.techniques import accumulation

    x = torch.ones(2, 2)
    for step in (
        lambda: accumulation.training_step(layer, layer, torch.nn.functional.mse_loss, x, x),
        lambda: accumulation.accumulation_step(layer, layer, torch.nn.functional.mse_loss, x, x, 2),
    ):
        with pytest.raises(TypeError, match=r"^optimizer = Linear\(in_features=2.*: expected an "):
            step()


def test_master_weights_keep_16_bytes_per_param_at_rest():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Linear(32, 4)).to(torch.bfloat16)
    mw = O.MasterWeights(model, "adam", lr=1e-2)
    x = torch.randn(8, 32).to(torch.bfloat16)
    for _ in range(3):
        mw.zero_grad()
        model(x).float().pow(2).mean().backward()
        mw.step()
    n = sum(p.numel() for p in model.parameters())
    assert all(m.grad is None for m in mw.master)  # fp32 grads freed after the step
    for p, m in zip(mw.params, mw.master):  # the bf16 weights are the rounded master
        assert torch.equal(p.detach(), m.detach().to(torch.bfloat16))
    at_rest = (
        sum(p.numel() * 2 for p in mw.params)
        + sum(p.grad.numel() * 2 for p in mw.params)
        + sum(m.numel() * 4 for m in mw.master)
        + O.state_bytes(mw.optimizer)["moments"]
    )
    assert at_rest == 16 * n
    with pytest.raises(ValueError, match="float16/bfloat16"):
        O.MasterWeights(torch.nn.Linear(2, 2), lr=1e-3)
