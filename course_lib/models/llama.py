"""The Llama-shaped model of :mod:`course_lib.models` (which re-exports it): RMSNorm, SwiGLU MLP,
rotary embeddings, no biases, untied output (Touvron et al. 2023, arXiv:2302.13971).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from course_lib import validate
from course_lib.models._config_checks import _check_pos_int
from course_lib.shape import ModelShape


@dataclass(frozen=True)
class LlamaConfig:
    """Shape of a Llama decoder (Touvron et al. 2023, arXiv:2302.13971)."""

    vocab_size: int = 32000
    """number of token ids (Llama 1/2 SentencePiece vocabulary)"""
    block_size: int = 2048
    """maximum sequence length"""
    n_layer: int = 32
    """number of transformer blocks"""
    n_head: int = 32
    """attention heads; must divide n_embd"""
    n_embd: int = 4096
    """model width"""
    ffn_hidden: int = 11008
    """SwiGLU inner width (Llama-7B: 11008 ~ 8/3 * 4096 rounded up to a multiple of 256)"""
    norm_eps: float = 1e-5
    """RMSNorm epsilon"""
    rope_theta: float = 10000.0
    """rotary embedding base"""

    def __post_init__(self) -> None:
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd", "ffn_hidden"):
            _check_pos_int("LlamaConfig", name, getattr(self, name))
        validate.divisible(
            "LlamaConfig.n_embd",
            self.n_embd,
            "2 * n_head",
            2 * self.n_head,
            note="an even head size: rotary embeddings turn pairs of dims",
        )

    @classmethod
    def llama_7b_like(cls, **overrides) -> "LlamaConfig":
        """The Llama-7B shapes: 32 layers, width 4096, 32 heads, SwiGLU 11008, vocab 32000
        (6,738,415,616 parameters). Build it under FakeTensorMode; it does not fit in RAM."""
        return cls(**overrides)

    def shape(self, name: str = "Llama") -> ModelShape:
        """The model as a :class:`course_lib.shape.ModelShape`, in ``estimate``'s names (SwiGLU,
        RMSNorm, no biases, untied output, rotary positions, multi-head attention)."""
        return ModelShape(
            name,
            layers=self.n_layer,
            hidden=self.n_embd,
            heads=self.n_head,
            kv_heads=self.n_head,
            ffn=self.ffn_hidden,
            vocab=self.vocab_size,
            seq=self.block_size,
        )

    @classmethod
    def tiny(cls, **overrides) -> "LlamaConfig":
        """A small Llama with the same structure, for tests on CPU."""
        return cls(
            **{
                **dict(
                    vocab_size=128, block_size=64, n_layer=2, n_head=4, n_embd=64, ffn_hidden=176
                ),
                **overrides,
            }
        )


def _rope_tables(head_dim: int, length: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(length, dtype=torch.float32), inv_freq)  # (T, hs/2)
    return angles.cos(), angles.sin()


def _apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: (B, nh, T, hs); rotate consecutive pairs (x0, x1) by the position's angle
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out = torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1)  # (B, nh, T, hs/2, 2)
    return out.flatten(-2)


class LlamaBlock(nn.Module):
    """x + attn(rmsnorm(x)), then x + w2(silu(w1(rmsnorm(x))) * w3(rmsnorm(x)))."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        C, H = config.n_embd, config.ffn_hidden
        self.n_head = config.n_head
        self.attention_norm = nn.RMSNorm(C, eps=config.norm_eps)
        self.wq = nn.Linear(C, C, bias=False)
        self.wk = nn.Linear(C, C, bias=False)
        self.wv = nn.Linear(C, C, bias=False)
        self.wo = nn.Linear(C, C, bias=False)
        self.ffn_norm = nn.RMSNorm(C, eps=config.norm_eps)
        self.w1 = nn.Linear(C, H, bias=False)  # gate
        self.w3 = nn.Linear(C, H, bias=False)  # up
        self.w2 = nn.Linear(H, C, bias=False)  # down

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        hs = C // self.n_head
        h = self.attention_norm(x)
        q = self.wq(h).view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
        k = self.wk(h).view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
        v = self.wv(h).view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
        q, k = _apply_rope(q, cos, sin), _apply_rope(k, cos, sin)
        # fused attention (Llama implementations use it); its saved tensors depend on the kernel
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, nh, T, hs)
        x = x + self.wo(y.transpose(1, 2).reshape(B, T, C))
        h = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))  # SwiGLU (Shazeer 2020)


class Llama(nn.Module):
    """A Llama-shaped decoder: ``forward(idx) -> logits``; ``loss(idx, targets)``."""

    rope_cos: torch.Tensor  # (block_size, hs/2), a buffer
    rope_sin: torch.Tensor

    def __init__(self, config: LlamaConfig):
        super().__init__()
        if not isinstance(config, LlamaConfig):
            raise TypeError(f"config must be a LlamaConfig, got {type(config).__name__}")
        self.config = config
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.n_embd)
        self.layers = nn.ModuleList(LlamaBlock(config) for _ in range(config.n_layer))
        self.norm = nn.RMSNorm(config.n_embd, eps=config.norm_eps)
        self.output = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        cos, sin = _rope_tables(
            config.n_embd // config.n_head, config.block_size, config.rope_theta
        )
        self.register_buffer("rope_cos", cos, persistent=False)  # (block_size, hs/2)
        self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:  # idx: (B, T) int64
        B, T = idx.shape
        if T > self.config.block_size:
            raise ValueError(
                f"sequence length {T} is larger than block_size={self.config.block_size}"
            )
        x = self.tok_embeddings(idx)  # (B, T, C)
        cos, sin = self.rope_cos[:T], self.rope_sin[:T]
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.output(self.norm(x))  # (B, T, vocab_size)

    def loss(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy; ``targets`` (B, T) int64."""
        return F.cross_entropy(self(idx).flatten(0, 1), targets.flatten())
