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
)
_FLAGS = ("gated_mlp", "bias", "tied_embeddings", "learned_positions", "embedding_norm")
#: what a Llama-shaped model (the virtual cluster's) has
_LLAMA: dict[str, Any] = dict(
    gated_mlp=True,
    bias=False,
    tied_embeddings=False,
    learned_positions=False,
    norm="rmsnorm",
    embedding_norm=False,
    experts=0,
)


@dataclass(frozen=True)
class ModelShape:
    """A decoder-only transformer's shape, every field checked (``name = value: expected ...``).
    ``head_dim`` is hidden / heads (a property: q and o are hidden x hidden, as every formula of
    the course counts them)."""

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
        if self.hidden % self.heads:
            raise ValueError(f"heads = {self.heads}: expected a divisor of hidden = {self.hidden}")
        if self.heads % self.kv_heads:
            ok = [d for d in range(1, self.heads + 1) if self.heads % d == 0]
            raise ValueError(
                f"kv_heads = {self.kv_heads}: expected a divisor of heads = "
                f"{self.heads}: one of {', '.join(map(str, ok))}"
            )

    @property
    def head_dim(self) -> int:
        """Width of one attention head, hidden / heads."""
        return self.hidden // self.heads

    @property
    def kv_hidden(self) -> int:
        """Width of K and of V: kv_heads x head_dim (hidden for multi-head attention)."""
        return self.kv_heads * self.head_dim

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
        output, rotary positions, dense): ``["bias = True", ...]``, [] when it is."""
        return [f"{f} = {getattr(self, f)!r}" for f, ok in _LLAMA.items() if getattr(self, f) != ok]

    def replace(self, **changes: Any) -> Any:
        """A copy with ``changes`` (checked again)."""
        return dataclasses.replace(self, **changes)
