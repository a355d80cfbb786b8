"""Activation bytes: what autograd keeps for backward, for our MLP, one transformer layer (under
tensor and sequence parallelism, with recomputation) and our tiny GPT.

One formula per quantity: every other module (checkpointing, the planner) builds on
:func:`activation_bytes_transformer_layer` and :func:`activation_bytes_gpt`. Introduced in
notebooks/01_backprop_memory.ipynb; tensor parallelism in notebooks/11_tensor_parallelism.ipynb.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction
from typing import Any, Literal

from course_lib import validate as _v
from course_lib.measure.estimate.units import exact

__all__ = [
    "MLP_ACTIVATION_SAVES",
    "MlpActivation",
    "RECOMPUTE",
    "Recompute",
    "activation_bytes_mlp",
    "activation_bytes_transformer_layer",
    "activation_bytes_gpt",
]

#: what a layer recomputes in backward instead of keeping (Korthikanti et al. 2022, Sec. 5)
Recompute = Literal["none", "selective", "full"]
RECOMPUTE: tuple[Recompute, ...] = ("none", "selective", "full")

#: activation functions of our MLP and what autograd saves for each ("input" = pre-activation z,
#: "output" = activation u). From the derivative formulas in torch/csrc/autograd/derivatives.yaml.
MlpActivation = Literal["relu", "tanh", "sigmoid", "gelu", "silu", "identity"]
MLP_ACTIVATION_SAVES: dict[MlpActivation, str] = {
    "relu": "output",
    "tanh": "output",
    "sigmoid": "output",
    "gelu": "input",
    "silu": "input",
    "identity": "none",
}


def activation_bytes_mlp(
    batch: int,
    widths: Sequence[int],
    *,
    dtype_bytes: int = 4,
    activation: MlpActivation = "relu",
    include_input: bool = False,
    include_output: bool = True,
) -> int:
    """Bytes autograd keeps alive after the forward of our MLP (``course_lib.models.MLP``).

    ``widths = [d_0, d_1, ..., d_L]``: L Linear layers d_{i-1} -> d_i, the activation after every
    layer but the last. What autograd saves (torch/csrc/autograd/derivatives.yaml):

    * ``Linear`` (addmm) saves its input ``u_{i-1}`` (needed for dW = dz^T u); the weight is a
      parameter, not an activation.
    * ``relu``/``tanh``/``sigmoid`` save their output ``u_i`` -- the same storage the next Linear
      saves, so it is counted once; ``gelu``/``silu`` save their input ``z_i`` as well.
    * the model output ``z_L`` is alive as long as the caller holds it (``include_output``);
      the input ``x = u_0`` is counted only with ``include_input`` (MemoryMeter does not count
      tensors created before the block unless asked to).

    Exact bytes = dtype_bytes * batch * (sum_{i=1}^{L-1} d_i * (1 + [act saves input])
    + d_L * include_output + d_0 * include_input).
    Introduced in notebooks/01_backprop_memory.ipynb.
    """
    b = _v.count("batch", batch, minimum=1)
    widths = _v.counts("widths", widths, minimum=1)
    if len(widths) < 2:
        raise ValueError(f"widths = {widths!r}: expected at least 2 entries (in and out features)")
    act = _v.choice("activation", activation, MLP_ACTIVATION_SAVES, case_insensitive=True)
    per_hidden = 2 if MLP_ACTIVATION_SAVES[act] == "input" else 1
    elements = per_hidden * sum(widths[1:-1])
    elements += widths[-1] if include_output else 0
    elements += widths[0] if include_input else 0
    return _v.count("dtype_bytes", dtype_bytes, minimum=1) * b * elements


def activation_bytes_transformer_layer(
    seq: int,
    batch: int,
    hidden: int,
    heads: int,
    *,
    kv_heads: int | None = None,
    ffn: int | None = None,
    gated_mlp: bool = False,
    tp: int = 1,
    sequence_parallel: bool = False,
    dtype_bytes: int = 2,
    dropout: bool = True,
    recompute: Recompute = "none",
    layernorm_stats: bool = False,
) -> int | float:
    """Activation bytes one rank keeps for one transformer layer, Korthikanti et al. 2022
    (arXiv:2205.05198), Sec. 4, generalised to grouped-query attention and a gated MLP.

    With 16-bit values (``dtype_bytes=2``), 1-byte dropout masks, ``tp=1`` and no recomputation
    this is Eq. 1, ``sbh (34 + 5as/h)``. By part, in values of ``dtype_bytes`` (r = kv_heads /
    heads, f = ffn, default 4h):

    * inside the tensor-parallel regions (split over ``tp``): Q 1, K and V 2r, the output
      projection's input 1, the MLP's inner activations 2f/h (GeLU input and output) or 3f/h
      (SwiGLU: gate and up outputs and their product);
    * the attention core (split over ``tp``): the softmax output a s / h, with ``dropout`` also
      its 1-byte mask and the dropout output;
    * outside (on every rank; split over ``tp`` only with ``sequence_parallel``): the two
      LayerNorm inputs and outputs (the attention and MLP inputs), 4; with ``dropout`` the two
      residual-dropout masks, 2 sbh bytes; with ``layernorm_stats`` the LayerNorms' mean and rstd
      (4 sb fp32 values, which the paper leaves out).

    Tensor parallel: ``sbh (10 + 24/t + 5as/(ht))`` (Eq. 2); with sequence parallelism
    ``sbh (34/t + 5as/(ht))`` (Eq. 3). ``recompute="selective"`` recomputes the attention core
    (Eq. 6: 34 sbh; FlashAttention keeps the same); ``"full"`` keeps the layer's input only,
    ``dtype_bytes`` sbh (split over ``tp`` with sequence parallelism; Sec. 4.3). ``seq`` and
    ``heads`` need not divide by ``tp`` here. Bytes: int when exact, else float.
    """
    s, b = _v.count("seq", seq, minimum=1), _v.count("batch", batch, minimum=1)
    h, a = _v.count("hidden", hidden, minimum=1), _v.count("heads", heads, minimum=1)
    g = a if kv_heads is None else _v.count("kv_heads", kv_heads, minimum=1, maximum=a)
    f = 4 * h if ffn is None else _v.count("ffn", ffn, minimum=1)
    t = _v.count("tp", tp, minimum=1)
    p = _v.count("dtype_bytes", dtype_bytes, minimum=1)
    rec = _v.choice("recompute", recompute, RECOMPUTE, case_insensitive=True)
    outside_split = t if sequence_parallel else 1
    sbh = s * b * h
    if rec == "full":
        return exact(Fraction(p * sbh, outside_split))
    inside = p * ((2 + 2 * Fraction(g, a)) * sbh + (3 if gated_mlp else 2) * s * b * f)
    core = 0 if rec == "selective" else (2 * p + 1 if dropout else p) * a * s * s * b
    outside = 4 * p * sbh + (2 * sbh if dropout else 0) + (4 * 4 * s * b if layernorm_stats else 0)
    return exact((inside + core) / t + Fraction(outside, outside_split))


def activation_bytes_gpt(
    config: Any,
    batch: int,
    seq: int | None = None,
    *,
    tp: int = 1,
    sequence_parallel: bool = False,
    dtype_bytes: int = 4,
    include_logits: bool = True,
) -> int | float:
    """Exact bytes (one rank's) autograd keeps alive after the forward of our tiny GPT
    (``models.GPT``), whole or split by ``parallel.tensor.parallelize_gpt`` over ``tp`` ranks.

    Derived from what autograd saves in ``course_lib.models`` (manual attention, GELU MLP,
    LayerNorm, dropout=0, fp32) and checked exactly against MemoryMeter in tests/measure.
    Per layer, in values (B = batch, T = seq, C = n_embd, nh = n_head):

    * ln_1: its input, the residual stream (1 BTC), and its mean and rstd (2 BT); its output,
      saved by the qkv Linear (1 BTC)
    * attention: contiguous copies of q, k and v made by the batched matmuls and saved by them
      (3 BTC); the softmax output, saved by softmax and by att @ v (nh B T^2); the heads merged
      back into a contiguous (B, T, C) tensor, saved by c_proj (1 BTC). The qkv output itself
      and the pre-softmax scores are freed; the causal mask is a buffer slice (no new memory)
    * ln_2: input (the stream after the attention residual) 1 BTC + output 1 BTC + 2 BT
    * MLP: c_fc output = GELU input (4 BTC), GELU output, saved by c_proj (4 BTC)
    * residual adds save nothing

    = 16 BTC + 4 BT + nh B T^2 values per layer: :func:`activation_bytes_transformer_layer`
    with ``dropout=False`` plus the LayerNorm statistics, in our dtype (split over ``tp`` as that
    function says; the statistics along T with ``sequence_parallel``). Plus the replicated ln_f:
    input 1 BTC, output 1 BTC, stats 2 BT (with sequence parallelism the stream is gathered
    before it); plus the logits B T V when ``include_logits`` (the caller holds them; a loss
    computed in the block adds its own saved tensors, e.g. log-softmax output B T V for
    cross-entropy). The embedding lookups save the integer indices, created before the block.
    Introduced in notebooks/01_backprop_memory.ipynb; ``tp`` in notebooks/11.
    """
    names = ("n_layer", "n_head", "n_embd", "vocab_size", "block_size")
    if not all(hasattr(config, k) for k in names) or hasattr(config, "ffn_hidden"):
        raise TypeError(
            f"config = {_v.describe(type(config).__name__)}: expected a "
            "course_lib.models.GPTConfig (for other shapes use activation_bytes_transformer_layer)"
        )
    if getattr(config, "dropout", 0.0):
        raise ValueError(
            f"config.dropout = {config.dropout!r}: expected 0.0, for which the count is exact "
            "(dropout adds masks; see activation_bytes_transformer_layer)"
        )
    B = _v.count("batch", batch, minimum=1)
    block_size = int(config.block_size)
    T = block_size if seq is None else _v.count("seq", seq, minimum=1, maximum=block_size)
    t = _v.count("tp", tp, minimum=1)
    p = _v.count("dtype_bytes", dtype_bytes, minimum=1)
    C, V = int(config.n_embd), int(config.vocab_size)
    layer = activation_bytes_transformer_layer(
        T,
        B,
        C,
        int(config.n_head),
        tp=t,
        sequence_parallel=sequence_parallel,
        dtype_bytes=p,
        dropout=False,
    )
    stats = p * 4 * B * T // (t if sequence_parallel else 1)  # mean and rstd of ln_1, ln_2
    head = p * (2 * B * T * C + 2 * B * T + (B * T * V if include_logits else 0))
    return int(config.n_layer) * (layer + stats) + head
