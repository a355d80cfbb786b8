"""Models: published parameter counts, shapes, config validation, nanoGPT-equivalent attention."""

import math

import pytest
import torch
import torch.nn.functional as F

from course_lib.models import (
    GPT,
    MLP,
    GPTConfig,
    Llama,
    LlamaConfig,
    MLPConfig,
    count_params,
    gpt2_small,
    llama_7b_like,
)


def test_mlp_shapes_and_forward_matches_sequential():
    torch.manual_seed(0)
    cfg = MLPConfig(in_features=5, hidden=[7, 3], out_features=2, activation="gelu")
    assert cfg.hidden == (7, 3) and cfg.widths == [5, 7, 3, 2]
    m = MLP(cfg)
    x = torch.randn(4, 5)
    ref = m.layers[2](F.gelu(m.layers[1](F.gelu(m.layers[0](x)))))
    torch.testing.assert_close(m(x), ref)
    assert count_params(m) == 5 * 7 + 7 + 7 * 3 + 3 + 3 * 2 + 2


def test_configs_validate():
    with pytest.raises(ValueError, match="MLPConfig.activation = 'elu': expected one of relu"):
        MLPConfig(in_features=3, activation="elu")
    with pytest.raises(ValueError, match=r"MLPConfig.hidden\[1\] must be a positive int"):
        MLPConfig(in_features=3, hidden=(4, 0))
    with pytest.raises(
        ValueError, match="GPTConfig.n_embd = 10: expected a multiple of n_head = 4"
    ):
        GPTConfig(n_embd=10, n_head=4)
    with pytest.raises(ValueError, match="GPTConfig.dropout"):
        GPTConfig(dropout=1.5)
    with pytest.raises(ValueError, match="LlamaConfig.n_layer must be a positive int"):
        LlamaConfig(n_layer=0)
    with pytest.raises(TypeError, match="config must be a GPTConfig"):
        GPT(LlamaConfig.tiny())
    import dataclasses

    with pytest.raises(dataclasses.FrozenInstanceError):
        GPTConfig.tiny().n_layer = 3


@pytest.mark.slow
def test_published_parameter_counts():
    # nanoGPT's count for GPT-2 small (position embeddings included, lm_head tied)
    assert count_params(GPT(gpt2_small())) == 124_439_808
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():  # 6.7B parameters, nothing allocated
        assert count_params(Llama(llama_7b_like())) == 6_738_415_616


def test_gpt_forward_loss_and_tied_weights():
    cfg = GPTConfig.tiny()
    torch.manual_seed(0)
    m = GPT(cfg)
    assert m.lm_head.weight is m.wte.weight
    idx = torch.randint(0, cfg.vocab_size, (2, 10))
    logits = m(idx)
    assert logits.shape == (2, 10, cfg.vocab_size)
    loss = m.loss(idx, idx)
    assert abs(loss.item() - math.log(cfg.vocab_size)) < 0.5  # near-uniform at init
    with pytest.raises(ValueError, match="sequence length 65 is larger than block_size=64"):
        m(torch.zeros(1, 65, dtype=torch.long))
    untied = GPT(GPTConfig.tiny(tie_weights=False))
    assert count_params(untied) == count_params(m) + cfg.vocab_size * cfg.n_embd


def test_manual_attention_matches_sdpa():
    cfg = GPTConfig.tiny()
    torch.manual_seed(0)
    attn = GPT(cfg).blocks[0].attn
    x = torch.randn(2, 12, cfg.n_embd)
    B, T, C = x.shape
    q, k, v = attn.c_attn(x).split(C, dim=2)
    q, k, v = (t.view(B, T, cfg.n_head, C // cfg.n_head).transpose(1, 2) for t in (q, k, v))
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)
    torch.testing.assert_close(attn(x), attn.c_proj(ref), atol=1e-5, rtol=1e-5)


def test_gpt_is_causal():
    cfg = GPTConfig.tiny()
    m = GPT(cfg).eval()
    idx = torch.randint(0, cfg.vocab_size, (1, 16))
    changed = idx.clone()
    changed[0, -1] = (idx[0, -1] + 1) % cfg.vocab_size
    torch.testing.assert_close(m(idx)[:, :-1], m(changed)[:, :-1])


def test_llama_tiny_trains_one_step():
    cfg = LlamaConfig.tiny()
    torch.manual_seed(0)
    m = Llama(cfg)
    idx = torch.randint(0, cfg.vocab_size, (2, 16))
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    before = m.loss(idx, idx)
    before.backward()
    opt.step()
    assert m.loss(idx, idx).item() < before.item()
    assert m(idx).shape == (2, 16, cfg.vocab_size)
