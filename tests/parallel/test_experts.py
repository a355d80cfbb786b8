"""parallel.experts: the one-process MoE (routing, capacity drops, balancing loss, bias
balancing) and ExpertParallel against it at world sizes 1-4: each rank's output and input
gradient equal the MoE on that rank's tokens, the gradients after sync_moe_grads equal the
MoE's over all ranks' tokens, with and without dropping, softmax and sigmoid routers, a shared
expert; bytes sent equal estimate.ep_all_to_all_bytes; bad input refused."""

from __future__ import annotations

import pytest
import torch

import course_lib
from course_lib.measure import estimate
from course_lib.parallel import experts as X

D, F, E, K, T = 16, 32, 4, 2, 16
#: (capacity_factor, router, shared_experts): no drop, drops, sigmoid + shared, sigmoid drops
CASES = [(None, "softmax", 0), (0.5, "softmax", 1), (None, "sigmoid", 1), (1.0, "sigmoid", 0)]


def _build(cf, router, shared, n_experts=E):
    torch.manual_seed(0)
    return X.MoE(D, F, n_experts, K, capacity_factor=cf, router=router, shared_experts=shared)


def _tokens(world_size):
    return torch.randn(world_size, T, D, generator=torch.Generator().manual_seed(1))


def _worker(rank, world_size, n_experts):
    from course_lib.measure.comm import CommMeter

    out = {}
    for case in CASES:
        ep = X.ExpertParallel(_build(*case, n_experts=n_experts))
        x = _tokens(world_size)[rank].clone().requires_grad_()
        with CommMeter(dispatch=False) as fwd:
            y, aux = ep(x)
        with CommMeter(dispatch=False) as bwd:
            (y.square().mean() + aux).backward()
        X.sync_moe_grads(ep)
        r = ep.last_routing
        out[case] = {
            "y": y.detach(),
            "dx": x.grad,
            "grads": {n: p.grad for n, p in ep.named_parameters()},
            "first": ep.first,
            "routed": torch.bincount(r.experts[r.keep], minlength=n_experts).tolist(),
            "sent": (int(fwd.model_bytes_sent), int(bwd.model_bytes_sent)),
            "wire": (fwd.wire_bytes_sent, bwd.wire_bytes_sent),
            "calls": (fwd.calls, bwd.calls),
        }
    return out


def _check(world_size, n_experts=E):
    res = course_lib.launch(_worker, world_size, n_experts)
    xs = _tokens(world_size)
    for case in CASES:
        moe = _build(*case, n_experts=n_experts)
        for r in range(world_size):
            x = xs[r].clone().requires_grad_()
            y, aux = moe(x)
            ((y.square().mean() + aux) / world_size).backward()
            assert torch.allclose(y, res[r][case]["y"], atol=1e-6), (case, r)
            assert torch.allclose(x.grad * world_size, res[r][case]["dx"], atol=1e-6), (case, r)
        ref = dict(moe.named_parameters())
        for r in range(world_size):
            first = res[r][case]["first"]
            for name, grad in res[r][case]["grads"].items():
                if name.startswith("experts."):
                    _, i, rest = name.split(".", 2)
                    name = f"experts.{int(i) + first}.{rest}"
                want = ref[name].grad if ref[name].grad is not None else torch.zeros_like(grad)
                assert torch.allclose(want, grad, atol=1e-6), (case, r, name)
        routed = [res[r][case]["routed"] for r in range(world_size)]
        for r in range(world_size):
            pred = estimate.ep_all_to_all_bytes(routed, D, rank=r, dtype_bytes=4)
            assert res[r][case]["sent"] == (pred["sent_forward"], pred["sent_backward"])
            fwd_wire = res[r][case]["wire"][0]
            if world_size > 1 and fwd_wire is not None:
                assert fwd_wire >= pred["sent_forward"]  # gloo's framing on top
    return res


def test_moe_routing_capacity_and_losses():
    moe = _build(0.5, "softmax", 0)
    x = _tokens(1)[0]
    y, aux = moe(x)
    r = moe.last_routing
    assert y.shape == x.shape and r.experts.shape == (T, K)
    cap = estimate.moe_capacity(T, E, top_k=K, capacity_factor=0.5)
    assert cap == 4 and torch.bincount(r.experts[r.keep], minlength=E).max() <= cap
    assert torch.allclose(r.weights.sum(-1), torch.ones(T))  # top-2: renormalised
    # a token whose experts all dropped gets nothing but the shared experts (none here)
    dropped = ~r.keep.any(1)
    assert torch.equal(y[dropped], torch.zeros_like(y[dropped]))
    # balancing loss: 1 for uniform routing, E when every token picks expert 0
    uniform = torch.full((8, E), 1 / E)
    picks = torch.arange(8).remainder(E)[:, None]
    assert float(X.load_balancing_loss(uniform, picks)) == pytest.approx(1.0)
    collapsed = torch.zeros(8, E)
    collapsed[:, 0] = 1
    assert float(X.load_balancing_loss(collapsed, torch.zeros(8, 1, dtype=torch.long))) == E
    # DeepSeek-V3's bias: the overloaded expert's goes down, the idle ones' up
    bias = X.update_bias(torch.zeros(E), torch.zeros(8, 1, dtype=torch.long), 0.1)
    assert bias.tolist() == pytest.approx([-0.1, 0.1, 0.1, 0.1])


def test_expert_parallel_parity_two_ranks():
    res = _check(2)
    wire = res[0][CASES[0]]["wire"]
    assert res[0][CASES[0]]["calls"][0] == {"all_to_all_single": 3}
    if wire[0] is not None:  # gloo: 144 B of framing per message on top of the payload
        assert wire[0] - res[0][CASES[0]]["sent"][0] == 3 * 144


@pytest.mark.slow
def test_expert_parallel_parity_one_three_and_four_ranks():
    _check(1)
    _check(3, n_experts=6)
    _check(4, n_experts=8)


def test_bad_input():
    with pytest.raises(ValueError, match=r"top_k = 5: expected"):
        X.MoE(D, F, 4, 5)
    with pytest.raises(ValueError, match=r"router = 'relu': expected"):
        X.MoE(D, F, 4, 1, router="relu")
    with pytest.raises(ValueError, match=r"capacity_factor = 0: expected"):
        X.MoE(D, F, 4, 1, capacity_factor=0)
    moe = X.MoE(D, F, 4, 1)
    with torch.no_grad():
        moe.router.weight[0, 0] = float("nan")
    with pytest.raises(ValueError, match=r"router logits = non-finite values"):
        moe(torch.ones(3, D))
    with pytest.raises(TypeError, match="expected a parallel.experts.MoE"):
        X.ExpertParallel(torch.nn.Linear(2, 2))


def _three_ranks(rank, world_size):
    X.ExpertParallel(X.MoE(D, F, 4, 1))


def test_experts_not_divisible_by_ranks():
    with pytest.raises(course_lib.LaunchError, match=r"n_experts = 4: expected a multiple"):
        course_lib.launch(_three_ranks, 3)
