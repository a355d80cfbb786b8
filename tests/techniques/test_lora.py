"""LoRALinear / add_lora: frozen base, zero-initialised B, scaling, merge, parity with peft."""

import copy

import pytest
import torch
from torch import nn

from course_lib.models import GPT, GPTConfig, Llama, LlamaConfig, count_params
from course_lib.techniques.lora import LoRALinear, add_lora, lora_modules, trainable_params

TARGETS = ["c_attn", "c_proj", "c_fc"]


def _model(seed=0):
    torch.manual_seed(seed)
    return GPT(GPTConfig.tiny())


def test_step_zero_is_the_pretrained_model_and_only_adapters_train():
    model = _model()
    ref = copy.deepcopy(model)
    add_lora(model, r=4, alpha=8, targets=TARGETS)
    idx = torch.randint(0, 65, (2, 16), generator=torch.Generator().manual_seed(1))
    assert torch.equal(model(idx), ref(idx))  # B = 0: exactly the same function
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(n.endswith(("lora_A", "lora_B")) for n in trainable)
    # r * (d_in + d_out) per layer: c_attn 64->192, attn.c_proj 64->64, c_fc 64->256, mlp.c_proj 256->64
    assert trainable_params(model) == 2 * 4 * ((64 + 192) + (64 + 64) + (64 + 256) + (256 + 64))
    assert count_params(model) - trainable_params(model) == count_params(ref)
    model.loss(idx, idx).backward()
    assert all(p.grad is None for n, p in model.named_parameters() if not p.requires_grad)
    layer = next(iter(lora_modules(model).values()))
    assert layer.lora_B.grad.abs().sum() > 0  # A random, so B gets a gradient at step 0
    assert layer.lora_A.grad.abs().sum() == 0  # ... and A none yet (B = 0)


def test_forward_formula_and_merge():
    torch.manual_seed(0)
    base = nn.Linear(32, 16)
    layer = LoRALinear(copy.deepcopy(base), r=4, alpha=16)
    assert layer.scaling == 4.0
    nn.init.normal_(layer.lora_B)
    x = torch.randn(3, 5, 32)
    expected = base(x) + 4.0 * (x @ layer.lora_A.T @ layer.lora_B.T)
    torch.testing.assert_close(layer(x), expected)
    before = layer(x).detach()
    layer.merge()
    torch.testing.assert_close(layer.base.weight, base.weight + 4.0 * layer.lora_B @ layer.lora_A)
    torch.testing.assert_close(layer(x), before, rtol=1e-5, atol=1e-5)  # fp32: the sums reassociate
    layer.unmerge()
    torch.testing.assert_close(layer.base.weight, base.weight, rtol=0, atol=1e-6)


@pytest.mark.parametrize("r", [0, -1, 17, 2.0])
def test_bad_rank_names_the_layer_and_its_dims(r):
    with pytest.raises(
        ValueError,
        match=r"r = .*min\(d_in, d_out\) = 16 for layer 'blocks.0.x' \(d_in 32, d_out 16\)",
    ):
        LoRALinear(nn.Linear(32, 16), r=r, alpha=8, name="blocks.0.x")
    with pytest.raises(ValueError, match=r"layer 'blocks.0.attn.c_proj' \(d_in 64, d_out 64\)"):
        add_lora(_model(), r=65, alpha=8, targets=["c_proj"])


def test_unknown_target_lists_the_layers():
    with pytest.raises(
        ValueError,
        match=r"targets = \['wq'\]: expected names of linear layers of GPT, each one of "
        r"c_attn, c_fc, c_proj, lm_head \(or a dotted suffix of a full name\); 'wq' names none",
    ):
        add_lora(_model(), r=4, alpha=8, targets=["wq"])


def test_llama_7b_counts_on_meta_device():
    with torch.device("meta"):
        model = Llama(LlamaConfig.llama_7b_like())
    add_lora(model, r=8, alpha=16, targets=["wq", "wv"])
    assert trainable_params(model) == 4_194_304
    with torch.device("meta"):
        model = Llama(LlamaConfig.llama_7b_like())
    add_lora(model, r=8, alpha=16, targets=["wq", "wk", "wv", "wo", "w1", "w2", "w3"])
    assert trainable_params(model) == 19_988_480


@pytest.mark.slow
def test_parity_with_peft():
    peft = pytest.importorskip("peft")
    model = _model()
    ref = copy.deepcopy(model)
    add_lora(model, r=4, alpha=8, targets=TARGETS)
    gen = torch.Generator().manual_seed(3)
    for layer in lora_modules(model).values():
        layer.lora_B.data = (
            torch.randn(layer.lora_B.shape, generator=gen) * 0.1
        )  # a trained adapter
    pm = peft.get_peft_model(
        ref, peft.LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS, lora_dropout=0.0)
    )
    ours = lora_modules(model)
    copied = 0
    for name, mod in pm.named_modules():
        if isinstance(getattr(mod, "lora_A", None), nn.ModuleDict):
            key = name.removeprefix("base_model.model.")
            assert mod.scaling["default"] == ours[key].scaling
            assert mod.lora_A["default"].weight.shape == ours[key].lora_A.shape
            mod.lora_A["default"].weight.data.copy_(ours[key].lora_A)
            mod.lora_B["default"].weight.data.copy_(ours[key].lora_B)
            copied += 1
    assert copied == len(ours) == 8
    assert trainable_params(model) == sum(p.numel() for p in pm.parameters() if p.requires_grad)
    idx = torch.randint(0, 65, (2, 16), generator=gen)
    torch.testing.assert_close(model(idx), pm(idx), rtol=0, atol=0)
    for layer in ours.values():
        layer.merge()
    merged = pm.merge_and_unload()
    torch.testing.assert_close(model(idx), merged(idx), rtol=0, atol=0)


def test_memory_meter_measures_a_model_with_frozen_parameters():
    from course_lib.measure import estimate
    from course_lib.measure.memory import MemoryMeter

    model = add_lora(_model(), r=8, alpha=16, targets=TARGETS)
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.Adam(trainable, lr=1e-2)
    idx = torch.randint(0, 65, (4, 16), generator=torch.Generator().manual_seed(0))
    with MemoryMeter(model, opt) as mem:
        model.loss(idx, idx).backward()
        opt.step()
    k = trainable_params(model)
    pred = estimate.model_state_bytes(
        k, precision="fp32", optimizer="adam", n_param_tensors=len(trainable)
    )
    assert mem.end_breakdown["grads"] == pred["grads"] == 4 * k
    assert mem.end_breakdown["optimizer"] == pred["optimizer"]
