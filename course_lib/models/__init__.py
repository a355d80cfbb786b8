"""The models every unit measures: a small MLP, a tiny nanoGPT-shaped GPT and a Llama-shaped model.

Written out so that a learner can count, line by line, what autograd saves for backward: the
comments name the tensors that stay alive, and ``course_lib.measure.estimate`` turns them into
exact byte counts (``activation_bytes_mlp``, ``activation_bytes_gpt``) that MemoryMeter checks.

* ``MLP`` / ``MLPConfig``: Linear -> activation -> ... -> Linear.
* ``GPT`` / ``GPTConfig``: nanoGPT (https://github.com/karpathy/nanoGPT/blob/master/model.py)
  with the attention written out (no fused SDPA kernel) so the a*s^2 term of Korthikanti et al.
  2022 (arXiv:2205.05198) is visible. Presets: ``GPTConfig.tiny()``, ``GPTConfig.gpt2_small()``.
* ``Llama`` / ``LlamaConfig``: Llama shapes (RMSNorm, SwiGLU MLP, rotary embeddings, no biases,
  untied output). ``LlamaConfig.llama_7b_like()`` has the 6.74e9 parameters of Llama-7B
  (Touvron et al. 2023, arXiv:2302.13971); build it under ``FakeTensorMode`` to measure a
  training step without allocating it.

Introduced in notebooks/01_backprop_memory.ipynb.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from course_lib import validate
from course_lib.models._config_checks import _check_pos_int
from course_lib.models.llama import Llama, LlamaConfig  # its own file; re-exported
from course_lib.shape import ModelShape

__all__ = [
    "MLPConfig",
    "MLP",
    "GPTConfig",
    "GPT",
    "LlamaConfig",
    "Llama",
    "count_params",
    "gpt2_small",
    "llama_7b_like",
]


# ============================================================================================
# MLP
# ============================================================================================
_ACTIVATIONS = {
    "relu": nn.ReLU,
    "gelu": nn.GELU,
    "tanh": nn.Tanh,
    "sigmoid": nn.Sigmoid,
    "silu": nn.SiLU,
    "identity": nn.Identity,
}


@dataclass(frozen=True)
class MLPConfig:
    """Shape of an MLP: ``in_features -> hidden[0] -> ... -> hidden[-1] -> out_features``."""

    in_features: int
    """width of the input"""
    hidden: tuple[int, ...] = (256, 256)
    """widths of the hidden layers (each followed by the activation)"""
    out_features: int = 10
    """width of the output (no activation after the last Linear)"""
    activation: str = "relu"
    """one of relu, gelu, tanh, sigmoid, silu, identity"""
    bias: bool = True
    """whether the Linear layers have a bias"""

    def __post_init__(self) -> None:
        object.__setattr__(self, "hidden", tuple(self.hidden))
        _check_pos_int("MLPConfig", "in_features", self.in_features)
        _check_pos_int("MLPConfig", "out_features", self.out_features)
        for i, h in enumerate(self.hidden):
            _check_pos_int("MLPConfig", f"hidden[{i}]", h)
        validate.choice("MLPConfig.activation", self.activation, _ACTIVATIONS)

    @property
    def widths(self) -> list[int]:
        """``[in_features, *hidden, out_features]``: what ``estimate.activation_bytes_mlp`` takes."""
        return [self.in_features, *self.hidden, self.out_features]


class MLP(nn.Module):
    """Linear -> activation -> ... -> Linear, with the forward written out.

    For each layer i, ``z_i = u_{i-1} W_i^T + b_i`` and ``u_i = act(z_i)``. Autograd keeps ``u_{i-1}``
    (Linear needs it for dW) and, depending on the activation, ``u_i`` (relu/tanh/sigmoid) or
    ``z_i`` (gelu/silu) -- see ``estimate.activation_bytes_mlp``. Nothing else is stored on the
    module, so the measured activation memory is exactly what autograd saves.
    """

    def __init__(self, config: MLPConfig):
        super().__init__()
        if not isinstance(config, MLPConfig):
            raise TypeError(f"config must be an MLPConfig, got {type(config).__name__}")
        self.config = config
        w = config.widths
        self.layers = nn.ModuleList(
            nn.Linear(a, b, bias=config.bias) for a, b in zip(w[:-1], w[1:])
        )
        self.act = _ACTIVATIONS[config.activation]()

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, in_features)
        u = x
        for i, linear in enumerate(self.layers):
            z = linear(u)  # (B, d_i): saves u (its input)
            if i == len(self.layers) - 1:
                return z  # (B, out_features): the output, no activation
            u = self.act(z)  # (B, d_i): relu saves u, gelu saves z
        return u  # unreachable: there is always at least one layer


# ============================================================================================
# GPT (nanoGPT-shaped)
# ============================================================================================
@dataclass(frozen=True)
class GPTConfig:
    """Shape of a GPT-2 style decoder (nanoGPT's GPTConfig)."""

    vocab_size: int = 65
    """number of token ids"""
    block_size: int = 64
    """maximum sequence length (positions)"""
    n_layer: int = 2
    """number of transformer blocks"""
    n_head: int = 4
    """attention heads per block; must divide n_embd"""
    n_embd: int = 64
    """model width (hidden size h)"""
    dropout: float = 0.0
    """dropout probability; 0.0 skips the dropout calls (keeps the activation count exact)"""
    bias: bool = True
    """biases in Linear and LayerNorm (GPT-2: True)"""
    tie_weights: bool = True
    """share the token embedding with the output head (GPT-2 does)"""

    def __post_init__(self) -> None:
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            _check_pos_int("GPTConfig", name, getattr(self, name))
        validate.divisible("GPTConfig.n_embd", self.n_embd, "n_head", self.n_head)
        if not (isinstance(self.dropout, (int, float)) and 0.0 <= self.dropout < 1.0):
            raise ValueError(
                f"GPTConfig.dropout = {validate.describe(self.dropout)}: expected a number in [0, 1)"
            )

    @classmethod
    def tiny(cls, **overrides) -> "GPTConfig":
        """A GPT that trains in seconds on one CPU core (about 0.1M parameters)."""
        return cls(
            **{**dict(vocab_size=65, block_size=64, n_layer=2, n_head=4, n_embd=64), **overrides}
        )

    @classmethod
    def gpt2_small(cls, **overrides) -> "GPTConfig":
        """GPT-2 small, 124M parameters (Radford et al. 2019; nanoGPT's default)."""
        return cls(
            **{
                **dict(vocab_size=50257, block_size=1024, n_layer=12, n_head=12, n_embd=768),
                **overrides,
            }
        )

    def shape(self, name: str = "GPT") -> ModelShape:
        """The model as a :class:`course_lib.shape.ModelShape`, in ``estimate``'s names: GeLU MLP
        4h wide, LayerNorm, learned positions, biases and tied output as configured."""
        return ModelShape(
            name,
            layers=self.n_layer,
            hidden=self.n_embd,
            heads=self.n_head,
            kv_heads=self.n_head,
            ffn=4 * self.n_embd,
            vocab=self.vocab_size,
            seq=self.block_size,
            gated_mlp=False,
            bias=self.bias,
            tied_embeddings=self.tie_weights,
            learned_positions=True,
            norm="layernorm",
        )


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention, written out (softmax(q k^T / sqrt(hs)) v)."""

    causal_mask: torch.Tensor  # (block_size, block_size) bool, a buffer

    def __init__(self, config: GPTConfig):
        super().__init__()
        C = config.n_embd
        self.n_head = config.n_head
        self.dropout = config.dropout
        self.c_attn = nn.Linear(C, 3 * C, bias=config.bias)  # q, k, v in one matmul
        self.c_proj = nn.Linear(C, C, bias=config.bias)
        # True above the diagonal = "may not look at the future"; a buffer, sliced (a view) per
        # call so no new mask tensor is allocated in forward
        mask = torch.ones(config.block_size, config.block_size, dtype=torch.bool).triu(1)
        self.register_buffer("causal_mask", mask, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        hs = C // self.n_head
        q, k, v = self.c_attn(x).split(C, dim=2)  # 3 x (B, T, C) views of one (B, T, 3C)
        q = q.view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
        # matmul copies q and k into contiguous (B*nh, T, hs) batches and saves both copies
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))  # (B, nh, T, T)
        att = att.masked_fill(self.causal_mask[:T, :T], float("-inf"))  # saves the mask view only
        att = F.softmax(att, dim=-1)  # (B, nh, T, T): saved by softmax and by att @ v
        if self.dropout > 0 and self.training:
            att = F.dropout(att, p=self.dropout)
        y = att @ v  # (B, nh, T, hs): saves a contiguous copy of v
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C): a copy, saved by c_proj
        y = self.c_proj(y)
        if self.dropout > 0 and self.training:
            y = F.dropout(y, p=self.dropout)
        return y


class GPTMLP(nn.Module):
    """n_embd -> 4 n_embd -> GELU -> n_embd."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = config.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.c_fc(x)  # (B, T, 4C): saved by GELU
        h = self.gelu(h)  # (B, T, 4C): saved by c_proj
        h = self.c_proj(h)  # (B, T, C)
        if self.dropout > 0 and self.training:
            h = F.dropout(h, p=self.dropout)
        return h


class Block(nn.Module):
    """Pre-LayerNorm transformer block: x + attn(ln_1(x)), then x + mlp(ln_2(x))."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = GPTMLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))  # ln_1 saves x, its mean and rstd; the add saves nothing
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT(nn.Module):
    """A GPT-2 shaped language model. ``forward(idx) -> logits``; ``loss(idx, targets)``."""

    pos: torch.Tensor  # (block_size,) int64, a buffer

    def __init__(self, config: GPTConfig):
        super().__init__()
        if not isinstance(config, GPTConfig):
            raise TypeError(f"config must be a GPTConfig, got {type(config).__name__}")
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.block_size, config.n_embd)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_weights:
            self.lm_head.weight = self.wte.weight  # one tensor, counted once
        # positions as a buffer: slicing it allocates nothing in forward
        self.register_buffer("pos", torch.arange(config.block_size), persistent=False)
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        # GPT-2 init (nanoGPT): N(0, 0.02) weights, zero biases
        if isinstance(module, (nn.Linear, nn.Embedding)):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            torch.nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:  # idx: (B, T) int64
        B, T = idx.shape
        if T > self.config.block_size:
            raise ValueError(
                f"sequence length {T} is larger than block_size={self.config.block_size}"
            )
        x = self.wte(idx) + self.wpe(self.pos[:T])  # (B, T, C); the two lookups are freed
        if self.config.dropout > 0 and self.training:
            x = F.dropout(x, p=self.config.dropout)
        for block in self.blocks:
            x = block(x)  # (B, T, C)
        x = self.ln_f(x)  # (B, T, C): saved by lm_head
        return self.lm_head(x)  # (B, T, vocab_size)

    def loss(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy; ``targets`` (B, T) int64."""
        logits = self(idx)
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


# ============================================================================================
# helpers and presets
# ============================================================================================
def count_params(model: nn.Module, *, trainable_only: bool = False) -> int:
    """Number of parameter elements, each shared tensor counted once (tied embeddings)."""
    params = model.parameters()  # nn.Module.parameters() already de-duplicates shared tensors
    return sum(p.numel() for p in params if p.requires_grad or not trainable_only)


def gpt2_small(**overrides) -> GPTConfig:
    """Same as ``GPTConfig.gpt2_small()`` (124M parameters)."""
    return GPTConfig.gpt2_small(**overrides)


def llama_7b_like(**overrides) -> LlamaConfig:
    """Same as ``LlamaConfig.llama_7b_like()`` (6.74B parameters)."""
    return LlamaConfig.llama_7b_like(**overrides)
