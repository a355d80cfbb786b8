"""techniques.checkpointing: gradients equal the unchanged model's; bytes and FLOPs equal the
exact formulas of estimate.checkpointing, measured with MemoryMeter and FlopCounterMode."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from course_lib.measure import estimate
from course_lib.measure.memory import MemoryMeter
from course_lib.models import GPT, GPTConfig
from course_lib.techniques import checkpointing as ck

CFG = GPTConfig.tiny(n_layer=3, n_embd=32, n_head=2, block_size=32)
B, T = 2, 24
CASES = [
    ("none", 1, ck.MATMUL_OPS),
    ("full", 1, ck.MATMUL_OPS),
    ("every_k", 2, ck.MATMUL_OPS),
    ("every_k", 3, ck.MATMUL_OPS),
    ("selective", 1, ck.MATMUL_OPS),
    ("selective", 1, ("mm", "addmm")),
    ("selective", 1, ("bmm",)),
    ("segments", 2, ck.MATMUL_OPS),
    ("segments", 3, ck.MATMUL_OPS),
]


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(0)
    base = GPT(CFG)
    g = torch.Generator().manual_seed(1)
    idx = torch.randint(0, CFG.vocab_size, (B, T), generator=g)
    tgt = torch.randint(0, CFG.vocab_size, (B, T), generator=g)
    ref = copy.deepcopy(base)
    ref.loss(idx, tgt).backward()
    return base, idx, tgt, [p.grad for p in ref.parameters()]


@pytest.mark.parametrize("policy,k,ops", CASES)
def test_bytes_flops_and_gradients(setup, policy, k, ops):
    base, idx, tgt, ref = setup
    model = ck.apply_checkpointing(copy.deepcopy(base), policy, k=k, save_ops=ops)
    with MemoryMeter(model) as meter:
        logits = model(idx)
    del logits
    tl = meter.timeline
    kept = int(tl[tl["event"] == "post_forward"].iloc[-1]["activations"])
    assert kept == estimate.checkpointed_activation_bytes_gpt(
        CFG, B, T, policy=policy, k=k, save_ops=ops
    )
    with FlopCounterMode(display=False) as fc:
        model.loss(idx, tgt).backward()
    assert (
        fc.get_total_flops()
        == estimate.gpt_step_matmul_flops(CFG, B, T, policy=policy, k=k, save_ops=ops)["total"]
    )
    # same ops in the same order on the same inputs: recomputation reproduces every value, so the
    # gradients are bitwise equal on CPU (tolerance 0)
    for p, r in zip(model.parameters(), ref):
        torch.testing.assert_close(p.grad, r, rtol=0, atol=0)


def test_parity_with_dropout_needs_the_rng_state():
    cfg = GPTConfig.tiny(n_layer=2, n_embd=32, n_head=2, block_size=16, dropout=0.2)
    torch.manual_seed(0)
    base = GPT(cfg)
    idx = torch.randint(0, cfg.vocab_size, (2, 16))

    def grads(model):
        torch.manual_seed(123)
        model.loss(idx, idx).backward()
        return [p.grad for p in model.parameters()]

    ref = grads(copy.deepcopy(base))
    good = grads(ck.apply_checkpointing(copy.deepcopy(base), "full"))
    bad = grads(ck.apply_checkpointing(copy.deepcopy(base), "full", preserve_rng_state=False))
    for g, r in zip(good, ref):
        torch.testing.assert_close(g, r, rtol=0, atol=0)
    assert max(float((g - r).abs().max()) for g, r in zip(bad, ref)) > 1e-4


def test_layout_and_remove():
    assert ck.checkpoint_layout(5, "every_k", k=2) == [(0,), (2,), (4,)]
    assert ck.checkpoint_layout(5, "segments", k=2) == [(0, 1), (2, 3), (4,)]
    assert ck.checkpoint_layout(3, "none") == []
    model = GPT(CFG)
    names = [n for n, _ in model.named_parameters()]
    params = list(model.parameters())
    ck.apply_checkpointing(model, "segments", k=2)
    assert [type(b).__name__ for b in model.blocks] == ["Checkpointed", "Checkpointed"]
    assert list(model.parameters()) == params
    with pytest.raises(ValueError, match="already checkpointed"):
        ck.apply_checkpointing(model, "full")
    ck.remove_checkpointing(model)
    assert [n for n, _ in model.named_parameters()] == names


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(policy="full", k=0), r"k = 0: expected an int in 1\.\.3"),
        (dict(policy="every_k", k=-1), r"k = -1: expected an int in 1\.\.3"),
        (dict(policy="segments", k=4), r"k = 4: expected an int in 1\.\.3"),
        (dict(policy="full", k=2), r"k = 2: expected 1 with policy = 'full'"),
        (
            dict(policy="sqrt"),
            r"policy = 'sqrt': expected one of none, full, every_k, selective, segments",
        ),
        (
            dict(policy="selective", save_ops=("matmul",)),
            r"save_ops = \['matmul'\]: expected each one of mm, addmm",
        ),
    ],
)
def test_bad_input_names_parameter_value_and_choices(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ck.apply_checkpointing(GPT(CFG), **kwargs)
    with pytest.raises(TypeError, match="nn.ModuleList 'blocks'"):
        ck.apply_checkpointing(torch.nn.Linear(2, 2), "full")
    with pytest.raises(TypeError, match="k = 1.5"):
        ck.apply_checkpointing(GPT(CFG), "every_k", k=1.5)
