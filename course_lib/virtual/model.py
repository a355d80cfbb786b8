"""A Llama-shaped decoder with grouped-query attention, for the virtual cluster.

``llama_like(layers, hidden, heads, kv_heads, ffn, vocab)`` returns a :class:`LlamaLike`, a frozen
description of the shapes that is also the model builder ``model_fn`` of
:func:`course_lib.virtual.simulate_step`: calling it builds the ``nn.Module`` (do that on the meta
device or under ``FakeTensorMode``; a 70B model does not fit in RAM). It knows its exact
parameter count and which tensor-parallel degrees its shapes allow, so a bad ``tp`` is refused
before anything is traced.

Why not ``course_lib.models.Llama``: it has no ``kv_heads`` (Llama-2-70B uses 8 key/value heads
for 64 query heads, Ainslie et al. 2023, arXiv:2305.13245), and its blocks take the rotary tables
as arguments, which tensor parallelism's module plan does not see. Shapes otherwise match:
RMSNorm, SwiGLU MLP (Shazeer 2020), rotary embeddings, no biases, untied output layer
(Touvron et al. 2023, arXiv:2302.13971 and arXiv:2307.09288).

Per layer: ``2 h`` (two RMSNorm weights) ``+ 2 h^2`` (wq, wo) ``+ 2 h (kv_heads * h / heads)``
(wk, wv) ``+ 3 h f`` (w1, w3, w2); plus ``2 v h`` (embedding, output) and ``h`` (final norm).
Llama-2-70B: 80 layers, h 8192, 64 heads, 8 kv heads, f 28672, v 32000 -> 68,976,648,192.

Introduced in notebooks/10_zero_fsdp.ipynb.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from course_lib import validate as _v
from course_lib.shape import ModelShape

__all__ = ["LlamaLike", "llama_like", "PRESETS"]


@dataclass(frozen=True)
class LlamaLike:
    """Shapes of a Llama-style decoder; call it to build the module."""

    layers: int
    """number of transformer blocks"""
    hidden: int
    """model width h"""
    heads: int
    """query heads; must divide hidden into an even head size (rotary pairs)"""
    kv_heads: int
    """key/value heads (grouped-query attention); must divide heads"""
    ffn: int
    """SwiGLU inner width f"""
    vocab: int
    """vocabulary size v"""
    name: str = "llama-like"
    """label used in tables"""

    def __post_init__(self) -> None:
        for field in ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab"):
            _v.count(field, getattr(self, field), minimum=1)
        if self.hidden % self.heads or (self.hidden // self.heads) % 2:
            raise ValueError(
                f"heads = {self.heads}: expected a divisor of hidden = {self.hidden} "
                "that leaves an even head size (rotary embeddings rotate pairs)"
            )
        if self.heads % self.kv_heads:
            raise ValueError(
                f"kv_heads = {self.kv_heads}: expected a divisor of heads = {self.heads}"
            )

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def n_params(self) -> int:
        """Exact parameter count of the module this builds (``estimate.transformer_param_count``
        of its shape: two RMSNorms, Q/K/V/O and a SwiGLU per layer, untied embedding and output,
        a final norm; tests/virtual check it against the built module)."""
        from course_lib.measure import estimate

        return int(estimate.transformer_param_count(**self.shape(1).dense())["total"])

    def tp_problems(self, tp: int) -> list[str]:
        """Why ``tp``-way tensor parallelism cannot split these shapes ([] when it can).

        Column-parallel wq/wk/wv/w1/w3 and row-parallel wo/w2 (Shoeybi et al. 2019) need whole
        heads and whole SwiGLU columns on every rank: tp must divide heads, kv_heads and ffn.
        """
        out = []
        for field in ("heads", "kv_heads", "ffn"):
            value = getattr(self, field)
            if value % tp:
                out.append(f"{field} = {value} is not divisible by tp = {tp}")
        return out

    def valid_tp(self, limit: int | None = None) -> list[int]:
        """Every tp degree (up to ``limit``) these shapes allow."""
        top = self.kv_heads if limit is None else min(self.kv_heads, limit)
        return [t for t in range(1, top + 1) if not self.tp_problems(t)]

    def shape(self, seq: int) -> ModelShape:
        """These sizes as a :class:`course_lib.shape.ModelShape` trained on ``seq`` tokens."""
        return ModelShape(
            self.name,
            self.layers,
            self.hidden,
            self.heads,
            self.kv_heads,
            self.ffn,
            self.vocab,
            seq,
        )

    def __call__(self) -> "LlamaLikeModel":
        return LlamaLikeModel(self)


def llama_like(
    layers: int | ModelShape,
    hidden: int | None = None,
    heads: int | None = None,
    kv_heads: int | None = None,
    ffn: int | None = None,
    vocab: int | None = None,
    *,
    name: str | None = None,
) -> LlamaLike:
    """Shapes of a Llama-style decoder (see :class:`LlamaLike`): the six sizes, or one
    :class:`course_lib.shape.ModelShape` (a ``plan.ModelSpec``, ``LlamaConfig.shape()``) that is
    Llama-shaped (SwiGLU, RMSNorm, no biases, untied output, rotary positions, dense)."""
    if not isinstance(layers, ModelShape):
        return LlamaLike(layers, hidden, heads, kv_heads, ffn, vocab, name or "llama-like")  # type: ignore[arg-type]
    shape, sizes = layers, (hidden, heads, kv_heads, ffn, vocab)
    if any(v is not None for v in sizes):
        raise TypeError(
            f"hidden, heads, kv_heads, ffn, vocab = {sizes}: expected None with a shape "
            f"({shape.name} gives them)"
        )
    odd = shape.not_llama()
    if odd:
        raise ValueError(
            f"shape = {shape.name}: expected a Llama-shaped model (SwiGLU, RMSNorm, no biases, "
            f"untied output, rotary positions, dense); got {', '.join(odd)}"
        )
    s = shape
    return LlamaLike(s.layers, s.hidden, s.heads, s.kv_heads, s.ffn, s.vocab, name or s.name)


#: Named shapes. "zero-7.5b" and "7b" are Llama-7B blocks with the layer count / vocabulary
#: chosen so that the parameter count is the one the ZeRO paper (7.5e9) and the 7B exercise
#: (7e9) assume; "llama2-70b" is Llama-2-70B (arXiv:2307.09288, Table 1 and the released config).
PRESETS = {
    "llama-7b": LlamaLike(32, 4096, 32, 32, 11008, 32000, "llama-7b"),  # 6,738,415,616
    "7b": LlamaLike(32, 4096, 32, 32, 11008, 63932, "7b (llama-7b blocks)"),  # 7,000,002,560
    "zero-7.5b": LlamaLike(
        35, 4096, 32, 32, 11008, 50944, "7.5b (llama-7b blocks)"
    ),  # 7,500,754,944
    "llama2-70b": LlamaLike(80, 8192, 64, 8, 28672, 32000, "llama2-70b"),  # 68,976,648,192
}


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: (B, T, n, hs); rotate each half-pair (x1, x2) by the position's angle (GPT-NeoX layout)
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


class Block(nn.Module):
    """x + wo(attn(rmsnorm(x))), then x + w2(silu(w1(h)) * w3(h)) with h = rmsnorm(x).

    Head counts are read from the weight shapes in ``forward`` (``view(B, T, -1, hs)``), so the
    same code runs on a tensor-parallel rank that holds ``heads / tp`` query heads.
    """

    def __init__(self, cfg: LlamaLike):
        super().__init__()
        h, kv = cfg.hidden, cfg.kv_heads * cfg.head_dim
        self.head_dim, self.group = cfg.head_dim, cfg.heads // cfg.kv_heads
        self.attention_norm = nn.RMSNorm(h)
        self.wq = nn.Linear(h, h, bias=False)
        self.wk = nn.Linear(h, kv, bias=False)
        self.wv = nn.Linear(h, kv, bias=False)
        self.wo = nn.Linear(h, h, bias=False)
        self.ffn_norm = nn.RMSNorm(h)
        self.w1 = nn.Linear(h, cfg.ffn, bias=False)  # gate
        self.w3 = nn.Linear(h, cfg.ffn, bias=False)  # up
        self.w2 = nn.Linear(cfg.ffn, h, bias=False)  # down

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape  # x: (B, T, h)
        hs = self.head_dim
        a = self.attention_norm(x)
        q = _rotate(self.wq(a).view(B, T, -1, hs), cos, sin)  # (B, T, nq, hs)
        k = _rotate(self.wk(a).view(B, T, -1, hs), cos, sin)  # (B, T, nkv, hs)
        v = self.wv(a).view(B, T, -1, hs)  # (B, T, nkv, hs)
        y = F.scaled_dot_product_attention(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            is_causal=True,
            enable_gqa=self.group > 1,
        )  # (B, nq, T, hs)
        x = x + self.wo(y.transpose(1, 2).reshape(B, T, -1))
        f = self.ffn_norm(x)
        out: torch.Tensor = x + self.w2(F.silu(self.w1(f)) * self.w3(f))
        return out


class LlamaLikeModel(nn.Module):
    """``forward(idx) -> logits``: embedding, ``layers`` blocks, RMSNorm, untied output layer."""

    def __init__(self, cfg: LlamaLike):
        super().__init__()
        self.config = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab, cfg.hidden)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.norm = nn.RMSNorm(cfg.hidden)
        self.output = nn.Linear(cfg.hidden, cfg.vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:  # idx: (B, T) int64
        x = self.tok_embeddings(idx)  # (B, T, h)
        T, hs = idx.shape[1], self.config.head_dim
        pos = torch.arange(T, device=x.device, dtype=torch.float32)
        inv = 10000.0 ** (-torch.arange(0, hs, 2, device=x.device, dtype=torch.float32) / hs)
        ang = torch.outer(pos, inv)[None, :, None, :]  # (1, T, 1, hs/2)
        cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)  # once, shared by the blocks
        for layer in self.layers:
            x = layer(x, cos, sin)
        logits: torch.Tensor = self.output(self.norm(x))  # (B, T, v)
        return logits
