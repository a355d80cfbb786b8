"""The model of the 3-D run (:mod:`course_lib.plan.three_d`, which re-exports this module) and
its reference: the tiny GPT's shape as the course builds it and as the planner describes it, the
batch of each step (the same in every process), and one process training it on the full batch
with the same seed, which a 3-D run must match.
Introduced in notebooks/14_planning_a_run.ipynb."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from course_lib.models import GPT, GPTConfig
from course_lib.plan.specs import ModelSpec

__all__ = ["tiny_config", "tiny_spec", "make_batch", "reference_3d"]


def tiny_config(
    *, layers: int = 2, width: int = 32, heads: int = 4, vocab: int = 64, seq: int = 16
) -> GPTConfig:
    """The GPT of the 3-D run: untied head (see the module docstring), no dropout."""
    return GPTConfig(
        vocab_size=vocab,
        block_size=seq,
        n_layer=layers,
        n_head=heads,
        n_embd=width,
        tie_weights=False,
    )


def tiny_spec(config: GPTConfig) -> ModelSpec:
    """The same model as the planner describes it (GeLU MLP, biases, LayerNorm, learned
    positions, untied output)."""
    return ModelSpec(
        name="tiny GPT (3-D run)",
        layers=config.n_layer,
        hidden=config.n_embd,
        heads=config.n_head,
        kv_heads=config.n_head,
        ffn=4 * config.n_embd,
        vocab=config.vocab_size,
        seq=config.block_size,
        gated_mlp=False,
        bias=config.bias,
        tied_embeddings=config.tie_weights,
        learned_positions=True,
        norm="layernorm",
    )


def make_batch(
    step: int, rows: int, config: GPTConfig, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Step ``step``'s full batch: (rows, seq) token ids and next-token targets, the same in
    every process."""
    gen = torch.Generator().manual_seed(1000 * seed + step)
    tokens = torch.randint(0, config.vocab_size, (rows, config.block_size + 1), generator=gen)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def _build(config: GPTConfig, seed: int) -> GPT:
    torch.manual_seed(seed)
    return GPT(config)


def _optimizer(params: Iterable[nn.Parameter], lr: float) -> torch.optim.Adam:
    return torch.optim.Adam(params, lr=lr)


def reference_3d(
    *,
    steps: int = 2,
    batch: int = 8,
    lr: float = 1e-3,
    seed: int = 0,
    config: GPTConfig | None = None,
) -> dict[str, Any]:
    """One process, the full batch: losses per step and the parameters after ``steps``."""
    config = config or tiny_config()
    model = _build(config, seed)
    opt = _optimizer(model.parameters(), lr)
    losses = []
    for step in range(steps):
        x, y = make_batch(step, batch, config, seed)
        loss = model.loss(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return {
        "losses": losses,
        "params": {k: v.detach().clone() for k, v in model.named_parameters()},
    }
