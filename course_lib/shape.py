"""One description of a decoder-only transformer's shape, :class:`ModelShape`, read by every layer
that needs one: the formulas of ``course_lib.measure.estimate`` take its fields
(``estimate.transformer_param_count(**shape.dense())``), the planner's ``plan.ModelSpec`` extends
it, ``virtual.llama_like(shape)`` builds it on the virtual cluster, and the course's own models
describe themselves with it (``GPTConfig.shape()``, ``LlamaConfig.shape()``).

The field names are ``estimate``'s keyword vocabulary: ``layers`` (L), ``hidden`` (h), ``heads``
(a), ``kv_heads``, ``ffn`` (f), ``vocab`` (V), ``seq`` (s), ... Pure Python (no torch), so a
planning cell or a check uses it without importing a model. Introduced in
notebooks/14_planning_a_run.ipynb.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from course_lib import validate as _v

__all__ = ["Norm", "NORMS", "ModelShape"]

Norm = Literal["rmsnorm", "layernorm"]
NORMS: tuple[Norm, ...] = ("rmsnorm", "layernorm")

#: the fields ``estimate.transformer_param_count`` takes (what :meth:`ModelShape.dense` gives)
_DENSE = (
    "layers",
    "hidden",
    "heads",
    "kv_heads",
    "ffn",
    "vocab",
    "seq",
    "gated_mlp",
    "bias",
    "tied_embeddings",
    "learned_positions",
    "norm",
    "embedding_norm",
    "head_dim",
    "qk_norm",
    "parallel_block",
    "q_lora_rank",
    "kv_lora_rank",
    "rope_head_dim",
    "v_head_dim",
)
_FLAGS = (
    "gated_mlp",
    "bias",
    "tied_embeddings",
    "learned_positions",
    "embedding_norm",
    "qk_norm",
    "parallel_block",
)
#: the widths multi-head latent attention adds (0 without MLA)
_MLA = ("q_lora_rank", "kv_lora_rank", "rope_head_dim", "v_head_dim")
#: what a Llama-shaped model (the virtual cluster's) has
_LLAMA: dict[str, Any] = dict(
    gated_mlp=True,
    bias=False,
    tied_embeddings=False,
    learned_positions=False,
    norm="rmsnorm",
    embedding_norm=False,
    experts=0,
    parallel_block=False,
    kv_lora_rank=0,
    qk_norm=False,
)


class _Derived(int):
    """A head width computed from hidden / heads (not given): ``dataclasses.replace`` carries it
    as this type, so a copy with another hidden or heads computes it again."""


@dataclass(frozen=True)
class ModelShape:
    """A decoder-only transformer's shape, every field checked (``name = value: expected ...``).
    ``head_dim`` defaults to hidden / heads (q and o hidden x hidden, as the course's own models
    have them); given, it is independent of them (Qwen3-235B-A22B: 64 heads of 128 on a width of
    4,096; PaLM: 48 of 256 on 18,432). Attention is multi-head (kv_heads = heads), grouped-query
    (Ainslie et al. 2023, arXiv:2305.13245) or multi-query (kv_heads = 1, Shazeer 2019,
    arXiv:1911.02150), or multi-head latent attention (MLA, DeepSeek-AI 2024, arXiv:2405.04434
    Sec. 2.1) when ``kv_lora_rank`` > 0: K and V rebuilt from a latent of that width, queries
    from one of ``q_lora_rank`` (0: a full projection), and a decoupled RoPE part of
    ``rope_head_dim`` per query head plus one key shared by every head. ``parallel_block``:
    attention and MLP read the same normalized input side by side (PaLM, Chowdhery et al. 2022,
    arXiv:2204.02311 Sec. 2: one norm per layer, one tensor-parallel all-reduce per pass)."""

    name: str  # label used in tables
    layers: int  # transformer blocks L
    hidden: int  # model width h
    heads: int  # attention heads a
    kv_heads: int  # key/value heads (= heads for multi-head attention; fewer for GQA)
    ffn: int  # MLP inner width f
    vocab: int  # vocabulary V
    seq: int  # training sequence length s
    gated_mlp: bool = True  # SwiGLU (three matrices) instead of GeLU (two)
    bias: bool = False  # linear layers (and LayerNorms) carry biases
    tied_embeddings: bool = False  # output matrix shares the token embedding
    learned_positions: bool = False  # a learned position table of seq x h
    norm: Norm = "rmsnorm"  # "rmsnorm" or "layernorm"
    embedding_norm: bool = False  # a norm after the embedding (BLOOM)
    # mixture of experts (experts = 0: a dense model); ffn stays the dense layers' MLP width
    experts: int = 0  # routed experts per MoE layer E
    top_k: int = 0  # routed experts each token uses (active experts per token)
    shared_experts: int = 0  # experts every token uses (DeepSeek)
    expert_ffn: int = 0  # one expert's MLP width
    dense_layers: int = 0  # the first layers keep a dense MLP (DeepSeek-V3: 3)
    # attention as it is (defaults: multi-head attention of hidden / heads per head)
    head_dim: int = 0  # width of one query/key head (0: hidden / heads)
    qk_norm: bool = False  # an RMSNorm of head_dim on each query and key head (Qwen3)
    parallel_block: bool = False  # attention and MLP side by side from one norm (PaLM)
    q_lora_rank: int = 0  # MLA: width of the query latent (0: a full query projection)
    kv_lora_rank: int = 0  # MLA: width of the K/V latent (0: not MLA)
    rope_head_dim: int = 0  # MLA: decoupled RoPE width per query head and of the shared key
    v_head_dim: int = 0  # width of one value head (0: head_dim)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise TypeError(f"name = {_v.describe(self.name)}: expected a str")
        for f in ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "seq"):
            object.__setattr__(self, f, _v.count(f, getattr(self, f), minimum=1))
        for f in _FLAGS:
            if not isinstance(getattr(self, f), bool):
                raise TypeError(f"{f} = {_v.describe(getattr(self, f))}: expected True or False")
        _v.choice("norm", self.norm, NORMS)
        if _v.count("experts", self.experts, minimum=0):
            _v.count("top_k", self.top_k, minimum=1, maximum=self.experts)
            _v.count("expert_ffn", self.expert_ffn, minimum=1)
            _v.count("shared_experts", self.shared_experts, minimum=0)
            _v.count("dense_layers", self.dense_layers, minimum=0, maximum=self.layers - 1)
        else:
            for f in ("top_k", "shared_experts", "expert_ffn", "dense_layers"):
                _v.count(f, getattr(self, f), minimum=0, maximum=0)
        self._check_attention()
        if self.heads % self.kv_heads:
            ok = [d for d in range(1, self.heads + 1) if self.heads % d == 0]
            raise ValueError(
                f"kv_heads = {self.kv_heads}: expected a divisor of heads = "
                f"{self.heads}: one of {', '.join(map(str, ok))}"
            )

    def _check_attention(self) -> None:
        """head_dim given or hidden / heads; MLA's widths only with MLA, and all its heads."""
        if self.head_dim == 0 or isinstance(self.head_dim, _Derived):
            if self.hidden % self.heads:
                raise ValueError(
                    f"heads = {self.heads}: expected a divisor of hidden = {self.hidden} "
                    "(or give head_dim)"
                )
            object.__setattr__(self, "head_dim", _Derived(self.hidden // self.heads))
        else:
            _v.count("head_dim", self.head_dim, minimum=1)
        for f in _MLA:
            object.__setattr__(self, f, _v.count(f, getattr(self, f), minimum=0))
        if not self.kv_lora_rank:
            for f in ("q_lora_rank", "rope_head_dim"):
                _v.count(f, getattr(self, f), minimum=0, maximum=0)  # MLA's alone
        elif self.kv_heads != self.heads:
            raise ValueError(
                f"kv_heads = {self.kv_heads}: expected heads = {self.heads} with multi-head "
                f"latent attention (kv_lora_rank = {self.kv_lora_rank}: every head has its K, V)"
            )

    @property
    def mla(self) -> bool:
        """Multi-head latent attention (``kv_lora_rank`` > 0)."""
        return self.kv_lora_rank > 0

    @property
    def v_dim(self) -> int:
        """Width of one value head: ``v_head_dim``, or head_dim."""
        return self.v_head_dim or self.head_dim

    @property
    def kv_hidden(self) -> int:
        """Width of K and of V: kv_heads x head_dim (hidden for multi-head attention of
        hidden / heads per head)."""
        return self.kv_heads * self.head_dim

    @property
    def attention_width(self) -> int:
        """The width w whose 12 s w FLOPs per token and layer are the attention core's (Q K^T
        and A V, forward and backward; PaLM's 12 L H Q T with H Q = heads x head_dim):
        heads (query-key width + value width) / 2. hidden for multi-head attention of hidden /
        heads; DeepSeek-V3's MLA (128 heads, query-key 128 + 64 RoPE, value 128): 20,480,
        2.86 x its width of 7,168 (rounded down to a whole width when heads x the two widths is
        odd)."""
        return self.heads * (self.head_dim + self.rope_head_dim + self.v_dim) // 2

    @property
    def moe_layers(self) -> int:
        """Layers with a mixture-of-experts MLP (0 for a dense model)."""
        return self.layers - self.dense_layers if self.experts else 0

    def dense(self) -> dict[str, Any]:
        """The fields ``estimate.transformer_param_count`` (and the other shape formulas) take,
        under their names: ``estimate.transformer_param_count(**shape.dense())``."""
        return {f: getattr(self, f) for f in _DENSE}

    def shape(self) -> ModelShape:
        """This shape alone (a subclass's extra fields, such as a ModelSpec's source, dropped)."""
        return ModelShape(**{f.name: getattr(self, f.name) for f in dataclasses.fields(ModelShape)})

    def not_llama(self) -> list[str]:
        """What keeps this shape from being Llama-shaped (SwiGLU, RMSNorm, no biases, untied
        output, rotary positions, dense, heads of hidden / heads, plain attention and blocks):
        ``["bias = True", ...]``, [] when it is."""
        out = [f"{f} = {getattr(self, f)!r}" for f, ok in _LLAMA.items() if getattr(self, f) != ok]
        if self.heads * self.head_dim != self.hidden or self.v_head_dim:
            out.append(f"head_dim = {self.head_dim!r}")
        return out

    def replace(self, **changes: Any) -> Any:
        """A copy with ``changes`` (checked again)."""
        return dataclasses.replace(self, **changes)
