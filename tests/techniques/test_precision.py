"""course_lib.techniques.precision: bit layouts, the hand-written loss scaler vs GradScaler,
and one training step per recipe."""

from __future__ import annotations

import math

import pytest
import torch

from course_lib.techniques import precision as P


@pytest.mark.parametrize(
    "fmt, bits, exp, man, maxval",
    [
        ("fp32", 32, 8, 23, 3.4028234663852886e38),
        ("bf16", 16, 8, 7, 3.3895313892515355e38),
        ("fp16", 16, 5, 10, 65504.0),
        ("fp8_e4m3", 8, 4, 3, 448.0),
        ("fp8_e5m2", 8, 5, 2, 57344.0),
    ],
)
def test_bit_layout_matches_the_standard_formats(fmt, bits, exp, man, maxval):
    lay = P.bit_layout(fmt)
    assert (lay.bits, lay.exponent_bits, lay.mantissa_bits, lay.max) == (bits, exp, man, maxval)
    assert lay.eps == 2.0**-man
    # the smallest subnormal is representable and half of it rounds to 0
    assert P.round_trip(lay.smallest_subnormal, fmt) == lay.smallest_subnormal
    if fmt != "fp32":  # fp32's subnormal half is below what a Python float -> fp32 keeps exactly
        assert P.round_trip(lay.smallest_subnormal / 2.01, fmt) == 0.0


def test_bit_string_and_round_trip():
    assert P.bit_string(1.0, "bf16") == "0|01111111|0000000"
    assert P.bit_string(-2.5, "fp16") == "1|10000|0100000000"
    assert P.bit_string(448.0, "fp8_e4m3") == "0|1111|110"
    assert P.bit_string(1.0, torch.float32) == "0|01111111|" + "0" * 23
    assert P.round_trip(1e-8, "fp16") == 0.0  # underflow in fp16
    assert P.round_trip(1e-8, "bf16") != 0.0  # bf16 has fp32's exponent range
    assert math.isinf(P.round_trip(70000.0, "fp16"))  # overflow
    assert P.round_trip(1.0 + 1e-3, "bf16") == 1.0  # a tiny update is rounded away
    t = P.round_trip(torch.tensor([1e-8, 1.0]), "fp16")
    assert t.dtype == torch.float32 and t.tolist() == [0.0, 1.0]


def test_bad_format_names_the_choices():
    with pytest.raises(ValueError, match="fmt = 'fp12': expected one of .*fp32, bf16, fp16"):
        P.bit_layout("fp12")
    with pytest.raises(ValueError, match="fmt = torch.int8: expected one of"):
        P.bit_layout(torch.int8)


def _gradscaler_scales(flags, init, interval):
    p = torch.nn.Parameter(torch.zeros(3))
    opt = torch.optim.SGD([p], lr=0.1)
    gs = torch.amp.GradScaler("cpu", init_scale=init, growth_interval=interval)
    out = []
    for inf in flags:
        gs.scale(p.sum())
        p.grad = torch.full((3,), float("nan") if inf else 1.0)
        gs.step(opt)
        gs.update()
        out.append((gs.get_scale(), int(gs._growth_tracker)))
    return out


def test_dynamic_loss_scaler_follows_gradscaler_growth_and_backoff():
    flags = [False] * 4 + [True] + [False] * 5 + [True, True] + [False] * 7
    ref = P.DynamicLossScaler(init_scale=2.0**8, growth_interval=3)
    got = []
    for inf in flags:
        ref.update(inf)
        got.append((ref.get_scale(), ref.growth_tracker))
    assert got == _gradscaler_scales(flags, 2.0**8, 3)
    assert ref.skipped_steps == 3 and ref.steps == len(flags)


def test_dynamic_loss_scaler_matches_gradscaler_in_fp16_training():
    def run(kind):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 2))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = (
            torch.amp.GradScaler("cpu", init_scale=2.0**22, growth_interval=2)
            if kind == "torch"
            else P.DynamicLossScaler(init_scale=2.0**22, growth_interval=2)
        )
        gen = torch.Generator().manual_seed(0)
        skipped = []
        for _ in range(6):
            x = torch.randn(4, 8, generator=gen)
            r = P.train_step(
                model,
                opt,
                lambda m, x=x: m(x).float().pow(2).mean(),
                mode="fp16-mixed",
                scaler=scaler,
            )
            skipped.append(r.skipped)
        return [p.detach() for p in model.parameters()], skipped, scaler.get_scale()

    (pt, st, sct), (pr, sr, scr) = run("torch"), run("ref")
    assert st == sr and any(st) and not all(st)
    assert sct == scr
    for a, b in zip(pt, pr):
        torch.testing.assert_close(a, b, rtol=0, atol=0)  # same math: bit-identical


def test_unscaled_fp16_gradients_underflow_and_scaling_recovers_them():
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 4)
    x = torch.randn(8, 16)

    def grads(scaler):
        model.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.float16):
            out = model(x)
        loss = 1e-8 * out.float().sum()
        if scaler is None:
            loss.backward()
        else:
            scaler.scale(loss).backward()
            assert scaler.unscale_(model.parameters()) is False
        return model.weight.grad.clone()

    assert bool((grads(None) == 0).all())
    g = grads(P.DynamicLossScaler())
    model.zero_grad(set_to_none=True)
    (1e-8 * model(x).sum()).backward()
    # fp16 inputs carry ~5e-4 relative rounding, so compare the whole tensor (norm), not elementwise
    assert float((g - model.weight.grad).norm() / model.weight.grad.norm()) < 2e-3


def test_scaler_rejects_bad_settings():
    with pytest.raises(ValueError, match="backoff_factor = 1.5: expected a number in"):
        P.DynamicLossScaler(backoff_factor=1.5)
    with pytest.raises(ValueError, match="growth_interval = 0: expected an int >= 1"):
        P.DynamicLossScaler(growth_interval=0)
    with pytest.raises(ValueError, match="init_scale = -1: expected a number > 0"):
        P.DynamicLossScaler(init_scale=-1)


@pytest.mark.parametrize("mode", P.MODES)
def test_train_step_each_mode(mode):
    torch.manual_seed(0)
    model = P.prepare(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 1)), mode)
    want = torch.bfloat16 if mode == "bf16-true" else torch.float32
    assert all(p.dtype == want for p in model.parameters())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = P.make_scaler(mode)
    assert (scaler is not None) == (mode == "fp16-mixed")
    x = torch.randn(4, 8).to(want)
    before = [p.detach().clone() for p in model.parameters()]
    r = P.train_step(model, opt, lambda m: m(x).float().pow(2).mean(), mode=mode, scaler=scaler)
    assert isinstance(r.loss, float) and not r.skipped
    assert r.scale == (65536.0 if mode == "fp16-mixed" else 1.0)
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_train_step_bad_input():
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(
        ValueError, match="mode = 'fp8': expected one of fp32, bf16-mixed, fp16-mixed, bf16-true"
    ):
        P.train_step(model, opt, lambda m: m(torch.ones(1, 2)).sum(), mode="fp8")
    with pytest.raises(ValueError, match=r"scaler = None: expected make_scaler\('fp16-mixed'\)"):
        P.train_step(model, opt, lambda m: m(torch.ones(1, 2)).sum(), mode="fp16-mixed")
