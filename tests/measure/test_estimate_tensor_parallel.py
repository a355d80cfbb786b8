"""estimate.tensor_parallel: Korthikanti et al.'s closed forms, parameter counts of real models,
communication per layer, and bad input."""

from __future__ import annotations

import pytest
import torch

from course_lib.measure import estimate as E
from course_lib.models import GPT, GPTConfig, LlamaConfig, count_params


@pytest.mark.parametrize("t", [1, 2, 4, 8])
def test_activation_bytes_reproduce_the_papers_equations(t):
    s, b, h, a = 2048, 4, 6144, 48  # a GPT-3-like layer
    eq1 = s * b * h * (34 + 5 * a * s / h)
    eq2 = s * b * h * (10 + 24 / t + 5 * a * s / (h * t))
    eq3 = s * b * h * (34 / t + 5 * a * s / (h * t))
    assert E.activation_bytes_transformer_layer(s, b, h, a, tp=t) == (eq1 if t == 1 else eq2)
    assert E.activation_bytes_transformer_layer(s, b, h, a, tp=t, sequence_parallel=True) == eq3
    # without dropout, 16-bit: the softmax output alone in the core
    assert E.activation_bytes_transformer_layer(s, b, h, a, dropout=False) == 2 * (
        16 * s * b * h + a * s * s * b
    )


def test_toy_formula_at_tp_1_is_the_single_process_count():
    cfg = GPTConfig.tiny()
    assert E.activation_bytes_gpt(cfg, 2, 16, tp=1) == E.activation_bytes_gpt(cfg, 2, 16)
    assert (
        E.activation_bytes_gpt(cfg, 2, 16, tp=4, sequence_parallel=True)
        < E.activation_bytes_gpt(cfg, 2, 16, tp=4)
        < E.activation_bytes_gpt(cfg, 2, 16)
    )


def test_params_per_rank_add_up_to_the_real_models():
    cfg = GPTConfig.tiny()
    assert E.tp_params_per_rank(cfg)["per_rank"] == count_params(GPT(cfg))
    p7 = E.tp_params_per_rank(LlamaConfig.llama_7b_like())
    assert p7["per_rank"] == 6_738_415_616  # Llama-7B
    p8 = E.tp_params_per_rank(LlamaConfig.llama_7b_like(), 8)
    assert p8["per_rank"] == p7["sharded"] // 8 + p7["replicated"]
    with torch.device("meta"):
        one = GPT(GPTConfig.tiny(n_layer=1))
    layer = sum(p.numel() for p in one.blocks[0].parameters())
    assert E.tp_layer_state_bytes(GPTConfig.tiny(), 1, bytes_per_param=1)["bytes"] == layer


def test_comm_bytes_per_layer():
    c = E.tp_comm_bytes_per_layer(2048, 1, 4096, 8)
    assert c["payload"] == 2048 * 4096 * 2
    assert c["sent"] == 4 * E.ring_allreduce_bytes_sent(c["payload"], 8)
    sp = E.tp_comm_bytes_per_layer(2048, 1, 4096, 8, sequence_parallel=True)
    assert sp["sent_forward"] == c["sent_forward"]  # all-gather + reduce-scatter = all-reduce
    assert sp["sent_backward"] == 1.5 * c["sent_backward"]  # the gathers done again
    assert E.tp_comm_bytes_per_layer(16, 4, 64, 1)["sent"] == 0


def test_bad_input():
    with pytest.raises(ValueError, match="tp = 0"):
        E.activation_bytes_transformer_layer(8, 1, 64, 4, tp=0)
    with pytest.raises(TypeError, match="GPTConfig"):
        E.activation_bytes_gpt(object(), 1)
    with pytest.raises(ValueError, match="tp = 7"):
        E.tp_params_per_rank(GPTConfig.tiny(), 7)
