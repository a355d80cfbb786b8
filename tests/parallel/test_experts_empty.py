"""parallel.experts under any routing (issue 47, item 1 and 2): ExpertParallel against the
one-process MoE when experts, or whole ranks, receive no token, in forward and backward, at
W = 2, 3 and 4; the issue's two reproductions (every token to expert 0; top-1, 4 experts,
2 ranks, 1 token per rank over 20 seeds), which hung before; a rank that skips the backward
exchange gives its peer an error naming the rank and the exchange; bad input refused before
any collective with MoE's message."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import course_lib
from course_lib.parallel import experts as X

D, FF = 8, 16
BOOST = 30.0  # a logit this much higher makes the chosen expert every token's first choice


class Forced(nn.Module):
    """The router's Linear, plus BOOST on one expert: ``target`` for every token, or (None)
    the expert id each token carries in its first feature. Same module in MoE and EP."""

    def __init__(self, linear: nn.Module, n_experts: int, target: int | None):
        super().__init__()
        self.linear, self.n, self.target = linear, n_experts, target

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.linear(x)  # (T, E)
        if self.target is None:
            to = x[:, 0].detach().round().long().clamp(0, self.n - 1)
        else:
            to = torch.full((x.shape[0],), self.target, dtype=torch.long)
        return logits + BOOST * F.one_hot(to, self.n).to(logits.dtype)


KINDS = ("natural", "one_expert", "forced", "one_token", "empty_rank")


def _trial(seed: int, world_size: int) -> dict[str, Any]:
    """One seeded routing: layer settings, each rank's tokens and output cotangent."""
    rnd, g = random.Random(seed), torch.Generator().manual_seed(seed)
    kind = KINDS[seed % len(KINDS)]
    e = world_size * rnd.choice([1, 2])
    t: dict[str, Any] = dict(kind=kind, seed=seed, n_experts=e, top_k=rnd.choice([1, 2]), cf=rnd.choice(
        [None, None, 1.0, 0.5]), router=rnd.choice(X.ROUTERS), shared=rnd.choice([0, 0, 1]),
        target=None)  # fmt: skip
    counts = [rnd.randint(1, 4) for _ in range(world_size)]
    if kind == "one_expert":  # every token of every rank to one expert, none dropped (softmax:
        # a sigmoid router's bias may outvote the boost)
        t.update(top_k=1, cf=None, router="softmax", target=rnd.randrange(e))
    elif kind == "forced":  # each token's first choice drawn, some ranks with no token
        counts = [rnd.randint(0, 3) for _ in range(world_size)]
    elif kind == "one_token":  # one token in all
        counts = [0] * world_size
        counts[rnd.randrange(world_size)] = 1
    elif kind == "empty_rank":
        counts[rnd.randrange(world_size)] = 0
    t["xs"] = [torch.randn(n, D, generator=g) for n in counts]
    if kind in ("forced", "one_token"):
        for x in t["xs"]:
            x[:, 0] = torch.randint(0, e, (x.shape[0],), generator=g).float()
    t["gs"] = [torch.randn(n, D, generator=g) for n in counts]
    t["bias"] = 0.1 * torch.randn(e, generator=g)
    return t


def _build(t: dict, forced: bool = True) -> X.MoE:
    torch.manual_seed(t["seed"])
    moe = X.MoE(D, FF, t["n_experts"], t["top_k"], capacity_factor=t["cf"],
                router=t["router"], shared_experts=t["shared"])  # fmt: skip
    moe.bias.copy_(t["bias"])
    if forced and t["kind"] != "natural":
        moe.router = Forced(moe.router, t["n_experts"], t["target"])  # type: ignore[assignment]
    return moe


def _step(ep: nn.Module, x: torch.Tensor, g: torch.Tensor) -> dict:
    x = x.clone().requires_grad_()
    y, aux = ep(x)
    ((y * g).sum() + aux).backward()
    X.sync_moe_grads(ep)
    grads = {n: p.grad.clone() for n, p in ep.named_parameters() if p.grad is not None}
    assert len(grads) == len(list(ep.parameters()))  # sync_moe_grads gives every one
    return {"y": y.detach(), "dx": x.grad, "grads": grads, "first": ep.first,
            "splits": ep.last_splits}  # fmt: skip


def _trials_worker(rank: int, world_size: int, trials: list[dict]) -> list[dict]:
    return [_step(X.ExpertParallel(_build(t)), t["xs"][rank], t["gs"][rank]) for t in trials]


def _assert_parity(t: dict, got: list[dict], forced: bool = True) -> None:
    """Each rank's output and dx equal the MoE's on its tokens; the synced gradients equal the
    MoE's of the mean of every rank's loss."""
    moe, w = _build(t, forced), len(got)
    for r in range(w):
        x = t["xs"][r].clone().requires_grad_()
        y, aux = moe(x)
        (((y * t["gs"][r]).sum() + aux) / w).backward()
        where = (t["kind"], t["seed"], r)
        torch.testing.assert_close(got[r]["y"], y.detach(), atol=1e-5, rtol=1e-5, msg=str(where))
        torch.testing.assert_close(got[r]["dx"], x.grad * w, atol=1e-5, rtol=1e-5)
    ref = dict(moe.named_parameters())
    for r in range(w):
        for name, grad in got[r]["grads"].items():
            if name.startswith("experts."):
                _, i, rest = name.split(".", 2)
                name = f"experts.{int(i) + got[r]['first']}.{rest}"
            want = ref[name].grad if ref[name].grad is not None else torch.zeros_like(grad)
            torch.testing.assert_close(grad, want, atol=1e-5, rtol=1e-5, msg=f"{t['seed']} {name}")


#: 50 seeded routings: 17 at W = 2, 17 at W = 3, 16 at W = 4
SEEDS = {2: range(0, 17), 3: range(17, 34), 4: range(34, 50)}


@pytest.mark.parametrize(
    "world_size",
    [2, pytest.param(3, marks=pytest.mark.slow), pytest.param(4, marks=pytest.mark.slow)],
)
def test_any_routing_matches_one_process(world_size):
    trials = [_trial(s, world_size) for s in SEEDS[world_size]]
    kinds = {t["kind"] for t in trials}
    assert kinds == set(KINDS)
    results = course_lib.launch(_trials_worker, world_size, trials, timeout=60)
    empty_ranks = 0
    for i, t in enumerate(trials):
        _assert_parity(t, [res[i] for res in results])
        empty_ranks += sum(len(x) == 0 for x in t["xs"])
        if t["kind"] == "one_expert":  # the expert's rank receives every row, the others none
            received = [sum(res[i]["splits"][1]) for res in results]
            assert sorted(received)[:-1] == [0] * (world_size - 1)
    assert empty_ranks >= 5


# ---- the two reproductions ---------------------------------------------------------
def test_every_token_to_expert_0_forward_and_backward():
    """Rank 1's experts get 0 rows: its backward skipped the combine's exchange and rank 0
    waited in the backward all-to-all until the time-out."""
    g = torch.Generator().manual_seed(0)
    t = dict(kind="one_expert", seed=0, n_experts=4, top_k=1, cf=None, router="softmax",
             shared=0, target=0, bias=torch.zeros(4),
             xs=[torch.randn(8, D, generator=g) for _ in "ab"],
             gs=[torch.randn(8, D, generator=g) for _ in "ab"])  # fmt: skip
    got = course_lib.launch(_trials_worker, 2, [t], timeout=20)
    assert [sum(res[0]["splits"][1]) for res in got] == [16, 0]  # rank 1 receives nothing
    _assert_parity(t, [res[0] for res in got])


def test_top1_one_token_per_rank_twenty_seeds():
    """Top-1, 4 experts, 2 ranks, 1 token per rank: the ranks fell out of step and read
    garbage split sizes. Natural routing (no forcing), the issue's loop of 20 seeds."""
    trials = []
    for seed in range(20):
        g = torch.Generator().manual_seed(seed)
        xs = [torch.randn(1, D, generator=g) for _ in range(2)]
        trials.append(dict(kind="natural", seed=seed, n_experts=4, top_k=1, cf=None,
                           router="softmax", shared=0, target=None, bias=torch.zeros(4),
                           xs=xs, gs=[torch.randn(1, D, generator=g) for _ in range(2)]))  # fmt: skip
    results = course_lib.launch(_trials_worker, 2, trials, timeout=20)
    for i, t in enumerate(trials):
        _assert_parity(t, [res[i] for res in results])
    # some seeds keep a rank's token at home and leave the other rank's experts empty
    assert any(0 in res[i]["splits"][1] for res in results for i in range(20))


# ---- a skipped exchange is named; bad input refused before any collective ------------------
def _skip_backward(rank: int, world_size: int) -> None:
    ep = X.ExpertParallel(_build(_trial(0, 2), forced=False), timeout=2)
    y, aux = ep(torch.randn(4, D, requires_grad=True))
    if rank == 0:
        (y.sum() + aux).backward()  # rank 1 never joins the backward exchange


def test_a_rank_left_waiting_names_itself_and_the_exchange():
    with pytest.raises(course_lib.LaunchError) as info:
        course_lib.launch(_skip_backward, 2, timeout=30)
    text = info.value.failures[0]
    assert "expert parallelism: rank 0 of 2 gave up on the combine all_to_all_single " in text
    assert "(backward) after at most 2 s (Operation timed out!)" in text
    assert 1 not in info.value.failures


def _bad_inputs(rank: int, world_size: int) -> dict[str, Any]:
    from course_lib.measure.comm import CommMeter

    moe = X.MoE(D, FF, 2 * world_size, 2)
    ep = X.ExpertParallel(moe)
    out: dict[str, Any] = {}
    bad = {"width": torch.randn(3, D + 1), "scalar": torch.tensor(1.0), "list": [0.0] * D,
           "int": torch.zeros(3, D, dtype=torch.long), "float64": torch.zeros(3, D).double(),
           "empty width": torch.zeros(0, D - 1)}  # fmt: skip
    for name, x in bad.items():
        with CommMeter(dispatch=False) as meter, pytest.raises((TypeError, ValueError)) as ep_err:
            ep(x)
        with pytest.raises(type(ep_err.value)) as moe_err:
            moe(x)
        out[name] = (str(ep_err.value), str(moe_err.value), meter.calls)
    # the ranks are still in step; rank 1's tokens (none) need no gradient, rank 0's do: both
    # ranks still run the backward exchanges
    x = torch.randn(2, D, requires_grad=True) if rank == 0 else torch.zeros(0, D)
    y, aux = ep(x)
    (y.sum() + aux).backward()
    out["in step"] = (tuple(y.shape), ep.last_splits[0], x.grad)
    return out


def test_bad_input_refused_before_any_collective_as_moe_does():
    res = course_lib.launch(_bad_inputs, 2, timeout=30)
    assert res[1].pop("in step")[:2] == ((0, D), [0, 0])  # rank 1 sends no row
    shape, _, dx = res[0].pop("in step")
    assert shape == (2, D) and dx is not None and dx.shape == (2, D)
    for rank in (0, 1):
        for name, (ep_msg, moe_msg, calls) in res[rank].items():
            assert ep_msg == moe_msg and calls == {}, (name, ep_msg, moe_msg, calls)
    msgs = {name: m[0] for name, m in res[0].items()}
    assert msgs["width"] == (
        f"x.shape = (3, {D + 1}): expected (..., {D}), a last dimension of d_model = {D} "
        f"(got {D + 1})"
    )
    assert msgs["scalar"].startswith("x.shape = (): expected (..., 8)")
    assert msgs["list"].startswith("x = [0.0,") and "expected a tensor of tokens" in msgs["list"]
    assert msgs["int"] == "x.dtype = torch.int64: expected a floating-point dtype"
    assert msgs["float64"].startswith("x.dtype = torch.float64: expected the layer's dtype")
    assert msgs["empty width"].startswith(f"x.shape = (0, {D - 1}): expected (..., {D})")


def test_empty_batch_on_one_process():
    moe = X.MoE(D, FF, 4, 2, capacity_factor=1.0, shared_experts=1)
    x = torch.zeros(0, D, requires_grad=True)
    y, aux = moe(x)
    (y.sum() + aux).backward()
    assert y.shape == (0, D) and aux.item() == 0.0 and x.grad.shape == (0, D)
    assert all(p.grad is None or not p.grad.any() for p in moe.parameters())
