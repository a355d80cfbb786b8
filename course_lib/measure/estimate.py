"""Every analytic formula the course uses, in one place, each with its source.

Notebooks predict with these functions and then measure; because every chapter calls the same
function, two chapters can never disagree about a number.

Units
-----
* Memory and traffic are in **bytes**. Results are ``int`` where the count is exact and a
  ``float`` only where a division does not come out even (said in each docstring).
* ``GB`` means 10**9 bytes (what papers and vendors quote), ``GiB`` means 2**30 bytes (what
  ``torch.cuda.memory_allocated`` style tools usually print). ``fmt_bytes`` says which it uses.
* Bandwidths are bytes per second unless a name ends in ``GBps`` (10**9 bytes per second).
* Times are seconds; FLOPs are floating-point operations (a multiply-add counts as 2).

This module imports nothing heavy (no torch), so it can be used anywhere, including in
planning cells that never touch a tensor. Introduced across the units; the memory formulas in
notebooks/01_backprop_memory.ipynb and notebooks/04_optimizer_memory.ipynb, the communication
formulas in notebooks/08_collectives.ipynb and notebooks/13_interconnects_and_backends.ipynb,
the roofline in notebooks/02_batch_size_and_accumulation.ipynb.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Iterable, Mapping, NamedTuple, Sequence

__all__ = [
    "PRECISIONS", "OPTIMIZERS", "COLLECTIVES", "LINK_SPEEDS", "Link",
    "dtype_bytes", "optimizer_state_bytes_per_param", "model_state_bytes",
    "ADAM8BIT_MIN_8BIT_SIZE", "ADAM8BIT_BLOCK_SIZE", "adam8bit_state_bytes",
    "zero_bytes_per_rank", "zero_state_breakdown_per_rank",
    "activation_bytes_mlp", "activation_bytes_transformer_layer", "activation_bytes_gpt",
    "ring_allreduce_bytes_sent", "naive_ring_allreduce_bytes_sent", "reduce_broadcast_bytes_sent",
    "allgather_bytes_sent", "reduce_scatter_bytes_sent", "scatter_bytes_sent", "gather_bytes_sent",
    "recursive_doubling_allreduce_bytes_sent", "ALLREDUCE_BYTES_ALGORITHMS", "allreduce_bytes_sent",
    "collective_bytes_sent", "pipeline_bubble_fraction",
    "alpha_beta_time", "allreduce_time", "fit_alpha_beta", "busbw", "algbw",
    "allreduce_time_on_link", "link_speed",
    "hierarchical_allreduce_breakdown", "hierarchical_allreduce_time", "ddp_exposed_comm_time",
    "matmul_flops", "matmul_bytes", "ELEMENTWISE_FLOPS", "ElementwiseCost", "elementwise_cost",
    "transformer_training_flops", "arithmetic_intensity",
    "matmul_arithmetic_intensity", "ridge_point", "attainable_flops", "roofline_time",
    "fmt_bytes", "GB", "GiB", "MiB", "KiB",
]

KiB = 2**10
MiB = 2**20
GiB = 2**30
GB = 10**9


# --------------------------------------------------------------------------------------------
# validation helpers
# --------------------------------------------------------------------------------------------
def _choice(name: str, value: Any, choices: Iterable[str]) -> str:
    choices = tuple(choices)
    if not isinstance(value, str) or value.lower() not in choices:
        raise ValueError(f"{name}={value!r} is not supported; valid choices: {', '.join(choices)}")
    return value.lower()


def _nonneg_int(name: str, value: Any) -> int:
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    if isinstance(value, numbers.Integral):  # int, numpy integers
        value = int(value)
    elif isinstance(value, numbers.Real) and float(value).is_integer():
        value = int(value)  # integral floats such as 7.5e9 (papers write parameter counts so)
    else:
        raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return value


def _pos_int(name: str, value: Any) -> int:
    value = _nonneg_int(name, value)
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return value


def _pos_number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {value!r} ({type(value).__name__})")
    if not value > 0:
        raise ValueError(f"{name} must be > 0, got {value}")
    return value


def _nonneg_number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {value!r} ({type(value).__name__})")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return value


def _exact(x: Fraction) -> int | float:
    """An int when the fraction is whole, else a float."""
    return int(x) if x.denominator == 1 else float(x)


# --------------------------------------------------------------------------------------------
# dtypes, model state, optimizer state
# --------------------------------------------------------------------------------------------
_DTYPE_BYTES = {
    "float64": 8, "fp64": 8, "double": 8,
    "float32": 4, "fp32": 4, "float": 4, "tf32": 4,
    "float16": 2, "fp16": 2, "half": 2,
    "bfloat16": 2, "bf16": 2,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "fp8": 1,
    "int64": 8, "long": 8, "int32": 4, "int": 4, "int16": 2, "short": 2,
    "int8": 1, "uint8": 1, "bool": 1,
}


def dtype_bytes(dtype: Any) -> int:
    """Bytes per element of ``dtype``: a ``torch.dtype`` or a name ("fp32", "bfloat16", "int8"...).

    >>> dtype_bytes("bf16")
    2
    """
    itemsize = getattr(dtype, "itemsize", None)  # torch.dtype and numpy dtypes have it
    if isinstance(itemsize, int) and not isinstance(dtype, str):
        return itemsize
    if isinstance(dtype, str):
        key = dtype.lower().removeprefix("torch.")
        if key in _DTYPE_BYTES:
            return _DTYPE_BYTES[key]
    raise ValueError(f"dtype={dtype!r} is not supported; valid choices: a torch.dtype or one of "
                     f"{', '.join(sorted(_DTYPE_BYTES))}")


#: precision recipes accepted by :func:`model_state_bytes`
PRECISIONS = ("fp32", "fp16-mixed", "bf16-mixed", "bf16-true")

# number of per-parameter state tensors each optimizer keeps (torch.optim, defaults)
_OPT_STATE_TENSORS = {
    "sgd": 0,        # plain SGD (momentum=0): no state
    "momentum": 1,   # SGD with momentum: momentum_buffer
    "rmsprop": 1,    # square_avg (momentum=0, centered=False)
    "adagrad": 1,    # sum
    "adam": 2,       # exp_avg, exp_avg_sq
    "adamw": 2,      # exp_avg, exp_avg_sq
    "adam8bit": 2,   # exp_avg, exp_avg_sq quantized to 8 bits (bitsandbytes)
}
#: optimizers accepted by :func:`model_state_bytes`
OPTIMIZERS = tuple(_OPT_STATE_TENSORS)
# optimizers whose torch.optim implementation keeps a scalar ``step`` tensor per parameter tensor
_STEP_COUNTER = {"adam", "adamw", "adagrad", "rmsprop"}


def optimizer_state_bytes_per_param(optimizer: str, *, state_dtype_bytes: int | None = None) -> int:
    """Optimizer state in bytes per parameter element (the ``K`` of the ZeRO paper, without master).

    ``sgd`` 0, ``momentum`` 1 buffer, ``rmsprop``/``adagrad`` 1, ``adam``/``adamw`` 2 buffers
    (first and second moment; Kingma & Ba 2014, arXiv:1412.6980), each ``state_dtype_bytes`` wide
    (default 4: torch.optim keeps state in the parameter's dtype, fp32 in the usual recipes).
    ``adam8bit`` keeps both moments in 1 byte each (Dettmers et al. 2021, arXiv:2110.02861), so
    ``state_dtype_bytes`` must be None or 1; the per-block absmax statistics (one fp32 per 256
    values, about 0.03 bytes/param) are not included (:func:`adam8bit_state_bytes` counts them,
    and the rest of bitsandbytes' state, exactly).

    Not included either: torch.optim's scalar ``step`` counter per *parameter tensor* (see
    ``n_param_tensors`` in :func:`model_state_bytes`).
    """
    opt = _choice("optimizer", optimizer, OPTIMIZERS)
    if opt == "adam8bit":
        if state_dtype_bytes not in (None, 1):
            raise ValueError(f"state_dtype_bytes={state_dtype_bytes!r} is not valid for "
                             "optimizer='adam8bit'; valid choices: None or 1 (8-bit state)")
        return 2
    width = 4 if state_dtype_bytes is None else _pos_int("state_dtype_bytes", state_dtype_bytes)
    return _OPT_STATE_TENSORS[opt] * width


def model_state_bytes(n_params: int, *, precision: str = "fp32", optimizer: str = "adam",
                      n_param_tensors: int = 0) -> dict[str, int]:
    """Bytes of model state (everything but activations) for one training replica.

    Returns ``{"params", "grads", "optimizer", "master", "total"}`` in bytes (ints).

    Recipes (Ψ = ``n_params``):

    =============  ======  =====  ======  =====================================
    precision      params  grads  master  optimizer state dtype
    =============  ======  =====  ======  =====================================
    ``fp32``       4Ψ      4Ψ     0       fp32
    ``fp16-mixed`` 2Ψ      2Ψ     4Ψ      fp32 (+ the fp32 master copy)
    ``bf16-mixed`` 2Ψ      2Ψ     4Ψ      fp32 (+ the fp32 master copy)
    ``bf16-true``  2Ψ      2Ψ     0       bf16 (torch.optim allocates state like the param)
    =============  ======  =====  ======  =====================================

    The mixed recipes follow Micikevicius et al. 2017 (arXiv:1710.03740) as accounted in the
    ZeRO paper (Rajbhandari et al. 2019, arXiv:1910.02054, Sec. 3.1): with Adam that is
    2Ψ + 2Ψ + (4Ψ + 4Ψ + 4Ψ) = 16Ψ, i.e. K = 12 counting the master copy. Note that
    ``torch.autocast`` works differently: it keeps fp32 parameters and casts copies per op, so
    its state is the ``fp32`` row (the casts show up as activations/temporaries).

    ``n_param_tensors``: torch.optim's Adam/AdamW/Adagrad/RMSprop also keep one scalar ``step``
    tensor (fp32, 4 bytes) per parameter *tensor*; pass the number of parameter tensors (e.g.
    ``len(list(model.parameters()))``) to count them exactly, as MemoryMeter measures them.
    Papers ignore them (default 0).
    """
    n = _nonneg_int("n_params", n_params)
    prec = _choice("precision", precision, PRECISIONS)
    opt = _choice("optimizer", optimizer, OPTIMIZERS)
    n_tensors = _nonneg_int("n_param_tensors", n_param_tensors)
    param_b = 4 if prec == "fp32" else 2
    master_b = 4 if prec in ("fp16-mixed", "bf16-mixed") else 0
    state_width = 2 if prec == "bf16-true" else 4
    opt_b = optimizer_state_bytes_per_param(opt, state_dtype_bytes=None if opt == "adam8bit"
                                            else state_width)
    step_bytes = 4 * n_tensors if opt in _STEP_COUNTER else 0
    out = {
        "params": param_b * n,
        "grads": param_b * n,
        "optimizer": opt_b * n + step_bytes,
        "master": master_b * n,
    }
    out["total"] = sum(out.values())
    return out


#: bitsandbytes' default: parameter tensors with fewer elements keep 32-bit optimizer state
ADAM8BIT_MIN_8BIT_SIZE = 4096
#: bitsandbytes' block size for blockwise 8-bit optimizer state (one fp32 absmax per block)
ADAM8BIT_BLOCK_SIZE = 256
_ADAM8BIT_CODE_BOOK_ENTRIES = 256  # an 8-bit code has 2**8 values


def adam8bit_state_bytes(param_numels: Iterable[Any], *, min_8bit_size: int = ADAM8BIT_MIN_8BIT_SIZE,
                         block_size: int = ADAM8BIT_BLOCK_SIZE,
                         max_unorm: float = 0.0) -> dict[str, int]:
    """Exact bytes of ``bitsandbytes.optim.Adam8bit`` state after the first step, by kind.

    ``param_numels``: the number of elements of every parameter tensor that gets a gradient
    (ints, or tensors: their ``numel()`` is used), e.g. ``[p.numel() for p in model.parameters()]``.
    bitsandbytes creates the state of a tensor at its first step with a gradient, so tensors
    without a gradient have none.

    Returns ``{"uint8_states", "fp32_states", "absmax", "code_books", "unorm", "total"}`` (ints):

    * ``uint8_states``: tensors with at least ``min_8bit_size`` elements (n each) keep both
      moments (``state1`` = m, ``state2`` = v) as 8-bit codes: 2n bytes -- the "2 bytes per
      parameter" of the paper;
    * ``fp32_states``: smaller tensors (biases, LayerNorm weights) keep both moments in fp32:
      8n bytes (bitsandbytes' ``min_8bit_size``, default 4096: small tensors gain nothing);
    * ``absmax``: blockwise quantization stores one fp32 scale per block of ``block_size``
      values and per moment (``absmax1``, ``absmax2``): 2 x 4 x ceil(n / block_size) bytes for
      each 8-bit tensor;
    * ``code_books``: the two 256-entry fp32 quantization maps (``qmap1``: signed dynamic map
      for m, ``qmap2``: unsigned for v) are *shared* by all 8-bit tensors of an optimizer:
      2 x 256 x 4 = 2,048 bytes once, 0 if no tensor is 8-bit;
    * ``unorm``: with ``max_unorm > 0`` (off by default) every tensor also gets a 1-element fp32
      ``unorm_vec``: 4 bytes per tensor;
    * the step counter is a Python int in bitsandbytes (``state["step"]``): 0 bytes.

    Source: bitsandbytes 0.50, ``bitsandbytes/optim/optimizer.py``, ``Optimizer2State.init_state``
    (the base of ``Adam8bit``; ``blocksize = 256`` is fixed there, ``block_size`` here exists to
    explore the trade-off) and ``Optimizer8bit.fill_qmap``; the method is Dettmers et al. 2022,
    "8-bit Optimizers via Block-wise Quantization", ICLR 2022, arXiv:2110.02861 (Sec. 2: blockwise
    quantization with dynamic quantization maps; the 32-bit state of small tensors is the library's
    practice). On a large model nearly every parameter sits in a large matrix and the total tends
    to 2 + 8 / 256 = 2.03125 bytes per parameter.

    >>> adam8bit_state_bytes([4096, 100])["total"]  # 2*4096 + 8*100 + 2*4*16 + 2048
    11168
    """
    min_size = _nonneg_int("min_8bit_size", min_8bit_size)
    block = _pos_int("block_size", block_size)
    if isinstance(max_unorm, bool) or not isinstance(max_unorm, numbers.Real) or max_unorm < 0:
        raise ValueError(f"max_unorm={max_unorm!r} must be a number >= 0 (0 disables the update-norm clip)")
    if isinstance(param_numels, (str, bytes, numbers.Number)) or not isinstance(param_numels, Iterable):
        raise TypeError(f"param_numels must be an iterable of element counts (one per parameter tensor), "
                        f"got {param_numels!r} ({type(param_numels).__name__})")
    out = {"uint8_states": 0, "fp32_states": 0, "absmax": 0, "code_books": 0, "unorm": 0}
    n_tensors = 0
    for i, item in enumerate(param_numels):
        n = item.numel() if callable(getattr(item, "numel", None)) else item
        n = _nonneg_int(f"param_numels[{i}]", n)
        n_tensors += 1
        if n < min_size:
            out["fp32_states"] += 2 * 4 * n
        else:
            out["uint8_states"] += 2 * n
            out["absmax"] += 2 * 4 * -(-n // block)  # ceil(n / block) fp32 scales per moment
            out["code_books"] = 2 * _ADAM8BIT_CODE_BOOK_ENTRIES * 4
    if max_unorm > 0:
        out["unorm"] = 4 * n_tensors
    out["total"] = sum(out.values())
    return out


# --------------------------------------------------------------------------------------------
# ZeRO
# --------------------------------------------------------------------------------------------
def zero_state_breakdown_per_rank(n_params: int, *, stage: int, world_size: int,
                                  k: int = 12) -> dict[str, int | float]:
    """Model-state bytes per rank under ZeRO, split into params / grads / optimizer (+ total).

    Accounting of the ZeRO paper (Rajbhandari et al. 2019, arXiv:1910.02054, Sec. 5 and
    Figure 1): fp16 params 2Ψ, fp16 grads 2Ψ, optimizer states KΨ (K = 12 for mixed-precision
    Adam: fp32 master, momentum, variance). Stage 0 is plain data parallelism (DDP, everything
    replicated); stage 1 (P_os) shards the optimizer states, stage 2 (P_os+g) also the gradients,
    stage 3 (P_os+g+p) also the parameters, over ``world_size`` = N_d ranks.

    Values are bytes: int when the shard divides evenly, else float.
    """
    n = _nonneg_int("n_params", n_params)
    if stage not in (0, 1, 2, 3) or isinstance(stage, bool):
        raise ValueError(f"stage={stage!r} is not supported; valid choices: 0, 1, 2, 3")
    nd = _pos_int("world_size", world_size)
    k = _nonneg_int("k", k)
    shard = Fraction(1, nd)
    params = Fraction(2 * n) * (shard if stage >= 3 else 1)
    grads = Fraction(2 * n) * (shard if stage >= 2 else 1)
    opt = Fraction(k * n) * (shard if stage >= 1 else 1)
    return {"params": _exact(params), "grads": _exact(grads), "optimizer": _exact(opt),
            "total": _exact(params + grads + opt)}


def zero_bytes_per_rank(n_params: int, *, stage: int, world_size: int, k: int = 12) -> int | float:
    """Total model-state bytes per rank under ZeRO stage 0-3 (see
    :func:`zero_state_breakdown_per_rank`). Reproduces Figure 1 of arXiv:1910.02054:
    Ψ = 7.5e9, N_d = 64 gives 120, 31.4, 16.6 and 1.9 GB for stages 0-3.
    """
    return zero_state_breakdown_per_rank(n_params, stage=stage, world_size=world_size,
                                         k=k)["total"]


# --------------------------------------------------------------------------------------------
# activations
# --------------------------------------------------------------------------------------------
#: activation functions of our MLP and what autograd saves for each ("input" = pre-activation z,
#: "output" = activation u). From the derivative formulas in torch/csrc/autograd/derivatives.yaml.
MLP_ACTIVATION_SAVES = {"relu": "output", "tanh": "output", "sigmoid": "output",
                        "gelu": "input", "silu": "input", "identity": "none"}


def activation_bytes_mlp(batch: int, widths: Sequence[int], *, dtype_bytes: int = 4,
                         activation: str = "relu", include_input: bool = False,
                         include_output: bool = True) -> int:
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
    b = _pos_int("batch", batch)
    widths = [_pos_int("widths[i]", w) for w in widths]
    if len(widths) < 2:
        raise ValueError(f"widths={widths!r} needs at least 2 entries (in and out features)")
    act = _choice("activation", activation, MLP_ACTIVATION_SAVES)
    per_hidden = 2 if MLP_ACTIVATION_SAVES[act] == "input" else 1
    elements = per_hidden * sum(widths[1:-1])
    elements += widths[-1] if include_output else 0
    elements += widths[0] if include_input else 0
    return _pos_int("dtype_bytes", dtype_bytes) * b * elements


def activation_bytes_transformer_layer(seq: int, batch: int, hidden: int, heads: int, *,
                                       bytes_per_value: int = 2, dropout: bool = True,
                                       recompute: str = "none") -> int:
    """Activation bytes of one transformer layer, Korthikanti et al. 2022 (arXiv:2205.05198).

    With 16-bit values (``bytes_per_value=2``), 1-byte dropout masks and no recomputation this is
    Eq. 1: ``s*b*h*(34 + 5*a*s/h)``. Derivation (Sec. 4.1), in values: attention keeps its input,
    Q, K, V, the output-projection input (5 sbh), the softmax output (a s^2 b) and the attention
    dropout output (a s^2 b); the MLP keeps its input, the GeLU input and output (9 sbh); the two
    LayerNorms their inputs (2 sbh); plus 1-byte masks of the two residual dropouts (2 sbh) and
    the attention dropout (a s^2 b). ``dropout=False`` drops the masks and the attention-dropout
    output. ``recompute="selective"`` recomputes the attention core (drops every a s^2 b term,
    Eq. 6: 34 sbh); ``"full"`` keeps only the layer input (2 sbh with 16-bit values, Sec. 4.3).
    """
    s, b = _pos_int("seq", seq), _pos_int("batch", batch)
    h, a = _pos_int("hidden", hidden), _pos_int("heads", heads)
    p = _pos_int("bytes_per_value", bytes_per_value)
    rec = _choice("recompute", recompute, ("none", "selective", "full"))
    if rec == "full":
        return p * s * b * h
    sbh, as2b = s * b * h, a * s * s * b
    values = 16 * sbh + (2 if dropout else 1) * as2b
    masks = (2 * sbh + as2b) if dropout else 0
    if rec == "selective":
        values -= (2 if dropout else 1) * as2b
        masks -= as2b if dropout else 0
    return p * values + masks


def activation_bytes_gpt(config: Any, batch: int, seq: int | None = None, *,
                         dtype_bytes: int = 4, include_logits: bool = True) -> int:
    """Exact bytes autograd keeps alive after the forward of our tiny GPT (``models.GPT``).

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

    = 16 BTC + 4 BT + nh B T^2 values per layer: Korthikanti et al.'s count (arXiv:2205.05198,
    Sec. 4.1) without dropout, in our dtype. Plus ln_f: input 1 BTC, output 1 BTC, stats 2 BT;
    plus the logits B T V when ``include_logits`` (the caller holds them; a loss computed in the
    block adds its own saved tensors, e.g. log-softmax output B T V for cross-entropy). The
    embedding lookups save the integer indices, which are created before the block.
    Introduced in notebooks/01_backprop_memory.ipynb.
    """
    names = ("n_layer", "n_head", "n_embd", "vocab_size", "block_size")
    if not all(hasattr(config, k) for k in names) or hasattr(config, "ffn_hidden"):
        raise TypeError(f"config must be a course_lib.models.GPTConfig, got {type(config).__name__} "
                        "(for other shapes use activation_bytes_transformer_layer)")
    if getattr(config, "dropout", 0.0):
        raise ValueError(f"config.dropout={config.dropout!r}: the exact count is for dropout=0.0 "
                         "(dropout adds masks; see activation_bytes_transformer_layer)")
    from_config = {k: getattr(config, k) for k in names}
    B = _pos_int("batch", batch)
    T = from_config["block_size"] if seq is None else _pos_int("seq", seq)
    C, nh, L, V = (from_config["n_embd"], from_config["n_head"], from_config["n_layer"],
                   from_config["vocab_size"])
    if T > from_config["block_size"]:
        raise ValueError(f"seq={T} is larger than config.block_size={from_config['block_size']}")
    per_layer = 16 * B * T * C + 4 * B * T + nh * B * T * T
    values = L * per_layer + 2 * B * T * C + 2 * B * T
    if include_logits:
        values += B * T * V
    return _pos_int("dtype_bytes", dtype_bytes) * values


# --------------------------------------------------------------------------------------------
# collectives: bytes each rank sends
# --------------------------------------------------------------------------------------------
#: collectives known to :func:`collective_bytes_sent` and :func:`busbw`
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce",
               "all_to_all", "send_recv", "scatter", "gather")


def ring_allreduce_bytes_sent(size_bytes: int, world_size: int) -> int | float:
    """Bytes each rank sends (and receives) in a ring all-reduce of ``size_bytes``:
    2(N-1)/N * S -- a reduce-scatter then an all-gather, each N-1 steps of S/N bytes.
    (Patarasuk & Yuan 2009, "Bandwidth optimal all-reduce algorithms for clusters of
    workstations"; https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md).
    int when N divides 2(N-1)S exactly, else float (real rings send whole elements; the
    float is the idealized figure). Introduced in notebooks/08_collectives.ipynb.
    """
    s, n = _nonneg_int("size_bytes", size_bytes), _pos_int("world_size", world_size)
    return _exact(Fraction(2 * (n - 1) * s, n))


def naive_ring_allreduce_bytes_sent(size_bytes: int, world_size: int) -> int:
    """Bytes each rank sends in the naive ring all-reduce that passes the *whole* tensor around
    the ring N-1 times (reduce) -- (N-1) * S -- the baseline the chunked ring improves on."""
    s, n = _nonneg_int("size_bytes", size_bytes), _pos_int("world_size", world_size)
    return (n - 1) * s


def reduce_broadcast_bytes_sent(size_bytes: int, world_size: int, *, root: bool = True) -> int:
    """All-reduce as reduce-to-root then broadcast-from-root (the parameter-server pattern).

    The root receives (N-1)*S during the reduce and sends (N-1)*S during the broadcast: it is the
    bottleneck. ``root=True`` returns the root's bytes sent, (N-1)*S; ``root=False`` a non-root's,
    S (it sends its tensor once and receives the result once).
    """
    s, n = _nonneg_int("size_bytes", size_bytes), _pos_int("world_size", world_size)
    return (n - 1) * s if root else (s if n > 1 else 0)


def allgather_bytes_sent(size_bytes: int, world_size: int) -> int | float:
    """Bytes each rank sends in a ring all-gather whose *output* is ``size_bytes``: (N-1)/N * S
    (each rank forwards N-1 shards of S/N). int when exact, else float."""
    s, n = _nonneg_int("size_bytes", size_bytes), _pos_int("world_size", world_size)
    return _exact(Fraction((n - 1) * s, n))


def reduce_scatter_bytes_sent(size_bytes: int, world_size: int) -> int | float:
    """Bytes each rank sends in a ring reduce-scatter whose *input* is ``size_bytes``:
    (N-1)/N * S. int when exact, else float."""
    s, n = _nonneg_int("size_bytes", size_bytes), _pos_int("world_size", world_size)
    return _exact(Fraction((n - 1) * s, n))


def _root_flag(root: Any) -> bool:
    if not isinstance(root, bool):
        raise ValueError(f"root={root!r} is not supported; valid choices: True (the root rank's "
                         "bytes), False (a non-root rank's bytes)")
    return root


def scatter_bytes_sent(size_bytes: int, world_size: int, *, root: bool) -> int | float:
    """Bytes one rank sends in a scatter of the root's ``size_bytes`` buffer (N chunks of S/N,
    chunk r to rank r), sent directly by the root (gloo's and MPI's linear algorithm).

    ``root=True``: the root sends every other rank its chunk, (N-1)/N * S; ``root=False``: a
    non-root sends nothing, 0. The same convention as CommMeter (``course_lib.measure.comm``),
    which counts the root's ``(N-1) * chunk`` bytes and nothing elsewhere. int when exact, else
    float. (MPI 4.0 standard, Sec. 6.6, MPI_Scatter; Thakur et al. 2005, IJHPCA 19(1).)
    """
    s, n = _nonneg_int("size_bytes", size_bytes), _pos_int("world_size", world_size)
    return _exact(Fraction((n - 1) * s, n)) if _root_flag(root) else 0


def gather_bytes_sent(size_bytes: int, world_size: int, *, root: bool) -> int | float:
    """Bytes one rank sends in a gather whose result at the root is ``size_bytes`` (N chunks of
    S/N, chunk r from rank r), each rank sending its chunk straight to the root.

    ``root=True``: the root sends nothing, 0 (its own chunk is a local copy; it *receives*
    (N-1)/N * S); ``root=False``: a non-root sends its chunk, S/N. The convention of CommMeter
    (``course_lib.measure.comm``). int when exact, else float. (MPI 4.0 standard, Sec. 6.5,
    MPI_Gather.)
    """
    s, n = _nonneg_int("size_bytes", size_bytes), _pos_int("world_size", world_size)
    if _root_flag(root) or n == 1:
        return 0
    return _exact(Fraction(s, n))


def recursive_doubling_allreduce_bytes_sent(size_bytes: int, world_size: int) -> int:
    """Bytes each rank sends in a recursive-doubling all-reduce: log2(N) * S.

    log2(N) steps; in step k rank r swaps its whole partial sum (S bytes) with rank r XOR 2^k
    (Thakur, Rabenseifner & Gropp 2005, "Optimization of collective communication operations in
    MPICH", IJHPCA 19(1), Sec. 4). Every rank sends the same amount. ``world_size`` must be a
    power of two (1, 2, 4, 8, ...), as in ``course_lib.parallel.collectives``.
    Introduced in notebooks/08_collectives.ipynb.
    """
    s, n = _nonneg_int("size_bytes", size_bytes), _pos_int("world_size", world_size)
    if n & (n - 1):
        raise ValueError(f"world_size={n} is not a power of two, which recursive doubling needs; "
                         "valid choices: 1, 2, 4, 8, 16, ...")
    return (n.bit_length() - 1) * s


#: all-reduce algorithms known to :func:`allreduce_bytes_sent` (the from-scratch ones of
#: ``course_lib.parallel.collectives``)
ALLREDUCE_BYTES_ALGORITHMS = ("ring", "naive_ring", "reduce_broadcast", "recursive_doubling")


def allreduce_bytes_sent(size_bytes: int, world_size: int, *, algorithm: str = "ring",
                         root: bool = True) -> int | float:
    """Bytes one rank sends in an all-reduce of ``size_bytes`` with ``algorithm``:

    * ``ring``: 2(N-1)/N * S (:func:`ring_allreduce_bytes_sent`)
    * ``naive_ring``: (N-1) * S (:func:`naive_ring_allreduce_bytes_sent`)
    * ``reduce_broadcast``: (N-1) * S at the root, S elsewhere (``root`` says which;
      :func:`reduce_broadcast_bytes_sent`)
    * ``recursive_doubling``: log2(N) * S, N a power of two
      (:func:`recursive_doubling_allreduce_bytes_sent`)

    ``root`` only matters for ``reduce_broadcast``. int when exact, else float.
    """
    algo = _choice("algorithm", algorithm, ALLREDUCE_BYTES_ALGORITHMS)
    if algo == "ring":
        return ring_allreduce_bytes_sent(size_bytes, world_size)
    if algo == "naive_ring":
        return naive_ring_allreduce_bytes_sent(size_bytes, world_size)
    if algo == "reduce_broadcast":
        return reduce_broadcast_bytes_sent(size_bytes, world_size, root=_root_flag(root))
    return recursive_doubling_allreduce_bytes_sent(size_bytes, world_size)


def collective_bytes_sent(collective: str, size_bytes: int, world_size: int, *,
                          root: bool | None = None) -> int | float:
    """Bytes one rank sends for ``collective`` on a payload of ``size_bytes`` with the
    bandwidth-optimal ring/pipeline algorithms (the convention CommMeter reports): all_reduce
    2(N-1)/N S; all_gather (S = output) and reduce_scatter (S = input) (N-1)/N S; all_to_all
    (N-1)/N S (the part addressed to other ranks); broadcast/reduce (N-1)/N S (a pipelined
    ring: N-1 of the N ranks forward the whole payload once -- averaged over ranks); send_recv S.

    scatter (S = the root's input) and gather (S = the root's output) are direct exchanges
    whose bytes differ between the root and the other ranks, so they need ``root``: True for
    the root, False for any other rank. scatter: root (N-1)/N S, others 0; gather: root 0,
    others S/N (:func:`scatter_bytes_sent`, :func:`gather_bytes_sent`). ``root`` is ignored
    for the other collectives, whose figure is the same on every rank.
    int when exact, else float.
    """
    c = _choice("collective", collective, COLLECTIVES)
    s, n = _nonneg_int("size_bytes", size_bytes), _pos_int("world_size", world_size)
    if c in ("scatter", "gather"):
        if root is None:
            raise ValueError(f"root=None is not supported for collective={c!r} (the root and the "
                             "other ranks send different amounts); valid choices: True (the "
                             "root rank's bytes), False (a non-root rank's bytes)")
        fn = scatter_bytes_sent if c == "scatter" else gather_bytes_sent
        return fn(s, n, root=root)
    if c == "all_reduce":
        return ring_allreduce_bytes_sent(s, n)
    if c == "send_recv":
        return s
    return _exact(Fraction((n - 1) * s, n))


def pipeline_bubble_fraction(stages: int, microbatches: int) -> float:
    """Idle fraction of a GPipe / 1F1B pipeline schedule: (p-1)/(m+p-1) (Huang et al. 2019,
    GPipe, arXiv:1811.06965; Narayanan et al. 2021, arXiv:2104.04473 Sec. 2.2 write the bubble
    time over ideal time as (p-1)/m). Introduced in unit 12 (pipeline parallelism)."""
    p, m = _pos_int("stages", stages), _pos_int("microbatches", microbatches)
    return (p - 1) / (m + p - 1)


# --------------------------------------------------------------------------------------------
# alpha-beta time models
# --------------------------------------------------------------------------------------------
def _beta(beta_s_per_byte: float | None, bandwidth: float | None) -> float:
    if (beta_s_per_byte is None) == (bandwidth is None):
        raise ValueError("give exactly one of beta_s_per_byte (s/byte) or bandwidth (bytes/s); "
                         f"got beta_s_per_byte={beta_s_per_byte!r}, bandwidth={bandwidth!r}")
    if bandwidth is not None:
        return 1.0 / _pos_number("bandwidth", bandwidth)
    return _nonneg_number("beta_s_per_byte", beta_s_per_byte)


def alpha_beta_time(size_bytes: float, *, alpha_s: float = 0.0, beta_s_per_byte: float | None = None,
                    bandwidth: float | None = None) -> float:
    """Hockney's model of one message: T = alpha + beta * S seconds (alpha: latency in s; beta:
    s/byte = 1/bandwidth in bytes/s; give beta_s_per_byte or bandwidth). Hockney 1994, "The
    communication challenge for MPP: Intel Paragon and Meiko CS-2", Parallel Computing 20(3)."""
    s = _nonneg_number("size_bytes", size_bytes)
    return _nonneg_number("alpha_s", alpha_s) + _beta(beta_s_per_byte, bandwidth) * s


ALLREDUCE_ALGORITHMS = ("ring", "tree", "recursive_doubling")


def allreduce_time(size_bytes: float, world_size: int, *, alpha: float = 0.0,
                   bandwidth: float | None = None, beta: float | None = None,
                   algorithm: str = "ring") -> float:
    """All-reduce time in seconds under the alpha-beta model (Thakur, Rabenseifner & Gropp 2005,
    "Optimization of collective communication operations in MPICH", IJHPCA 19(1); reduction
    compute ignored). p = world_size, n = size_bytes, beta = 1/bandwidth:

    * ``ring``: 2(p-1) alpha + 2(p-1)/p n beta (bandwidth-optimal, latency grows with p)
    * ``tree``: binary-tree reduce then broadcast, not pipelined: 2 ceil(log2 p) (alpha + n beta)
    * ``recursive_doubling``: ceil(log2 p) (alpha + n beta) (latency-optimal, for small messages)
    """
    n = _nonneg_number("size_bytes", size_bytes)
    p = _pos_int("world_size", world_size)
    a = _nonneg_number("alpha", alpha)
    b = _beta(beta, bandwidth)
    algo = _choice("algorithm", algorithm, ALLREDUCE_ALGORITHMS)
    if p == 1:
        return 0.0
    if algo == "ring":
        return 2 * (p - 1) * a + 2 * (p - 1) / p * n * b
    steps = math.ceil(math.log2(p))
    if algo == "tree":
        return 2 * steps * (a + n * b)
    return steps * (a + n * b)


def fit_alpha_beta(sizes: Sequence[float], times: Sequence[float], *,
                   relative: bool = False) -> tuple[float, float]:
    """Least-squares fit of T = alpha + beta * S to measured (size in bytes, time in s) pairs.

    Returns ``(alpha_s, beta_s_per_byte)``; 1/beta is the effective bandwidth in bytes/s. Needs at
    least two distinct sizes. Closed form.

    relative: ``False`` minimises the squared error in seconds (ordinary least squares), which the
        largest messages dominate: alpha, a few microseconds beside milliseconds, is then barely
        constrained and can even come out negative. ``True`` minimises the squared *relative*
        error, i.e. weights each point by 1/T^2, so small messages (which measure alpha) and large
        ones (which measure beta) count alike; the usual choice for latency-bandwidth fits
        (Hockney 1994, "The communication challenge for MPP", Parallel Computing 20(3)).
    """
    xs, ys = [float(s) for s in sizes], [float(t) for t in times]
    if len(xs) != len(ys):
        raise ValueError(f"sizes and times must have the same length, got {len(xs)} and {len(ys)}")
    if len(set(xs)) < 2:
        raise ValueError(f"need at least 2 distinct sizes to fit alpha and beta, got sizes={xs!r}")
    if relative and any(not y > 0 for y in ys):
        raise ValueError(f"relative=True needs every time > 0, got times={ys!r}")
    ws = [1.0 / (y * y) for y in ys] if relative else [1.0] * len(ys)
    w = sum(ws)
    mx = sum(wi * x for wi, x in zip(ws, xs)) / w
    my = sum(wi * y for wi, y in zip(ws, ys)) / w
    sxx = sum(wi * (x - mx) ** 2 for wi, x in zip(ws, xs))
    sxy = sum(wi * (x - mx) * (y - my) for wi, x, y in zip(ws, xs, ys))
    beta = sxy / sxx
    return my - beta * mx, beta


def algbw(size_bytes: float, time_s: float) -> float:
    """nccl-tests "algorithm bandwidth": size / time in bytes/s (S is the buffer size per rank)."""
    return _nonneg_number("size_bytes", size_bytes) / _pos_number("time_s", time_s)


_BUSBW_FACTOR = {
    "all_reduce": lambda n: Fraction(2 * (n - 1), n),
    "all_gather": lambda n: Fraction(n - 1, n),
    "reduce_scatter": lambda n: Fraction(n - 1, n),
    "all_to_all": lambda n: Fraction(n - 1, n),
    "broadcast": lambda n: Fraction(1),
    "reduce": lambda n: Fraction(1),
    "send_recv": lambda n: Fraction(1),
    "scatter": lambda n: Fraction(n - 1, n),
    "gather": lambda n: Fraction(n - 1, n),
}


def busbw(algbw: float, collective: str, world_size: int) -> float:
    """nccl-tests "bus bandwidth" = algbw x factor, comparable to the link's peak bandwidth:
    all_reduce 2(n-1)/n, all_gather / reduce_scatter / all_to_all / scatter / gather (n-1)/n,
    broadcast / reduce / send_recv 1. https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md
    (scatter and gather: nccl-tests src/scatter.cu, src/gather.cu, ``ScatterGetBw``/``GatherGetBw``)."""
    c = _choice("collective", collective, COLLECTIVES)
    n = _pos_int("world_size", world_size)
    return float(_nonneg_number("algbw", algbw) * _BUSBW_FACTOR[c](n))


# --------------------------------------------------------------------------------------------
# links
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Link:
    """A published interconnect bandwidth.

    ``GBps``: the headline figure in GB/s (1e9 bytes/s) as the vendor quotes it;
    ``per_direction_GBps``: what one direction carries (a ring all-reduce sends and receives at
    the same time, so this is what bounds it); ``source``: where the number comes from.
    """

    name: str
    GBps: float
    per_direction_GBps: float
    kind: str  # "intra-node" or "inter-node"
    source: str
    note: str = ""


LINK_SPEEDS: dict[str, Link] = {link.name: link for link in [
    Link("PCIe 4.0 x16", 32.0, 32.0, "intra-node",
         "PCI-SIG PCIe 4.0 spec: 16 GT/s x 16 lanes, 128b/130b -> ~31.5 GB/s per direction",
         "64 GB/s counting both directions"),
    Link("PCIe 5.0 x16", 64.0, 64.0, "intra-node",
         "PCI-SIG PCIe 5.0 spec: 32 GT/s x 16 lanes -> ~63 GB/s per direction",
         "128 GB/s counting both directions"),
    Link("NVLink A100", 600.0, 300.0, "intra-node",
         "https://www.nvidia.com/en-us/data-center/a100/ (NVLink 3: 12 links, 600 GB/s total)",
         "600 GB/s is bidirectional aggregate; 300 GB/s per direction"),
    Link("NVLink H100", 900.0, 450.0, "intra-node",
         "https://www.nvidia.com/en-us/data-center/h100/ (NVLink 4: 18 links, 900 GB/s total)",
         "900 GB/s is bidirectional aggregate; 450 GB/s per direction"),
    Link("InfiniBand NDR", 50.0, 50.0, "inter-node",
         "https://www.nvidia.com/en-us/networking/infiniband-adapters/ (ConnectX-7, 400 Gb/s)",
         "400 Gb/s = 50 GB/s per port per direction"),
    Link("InfiniBand HDR", 25.0, 25.0, "inter-node",
         "https://www.nvidia.com/en-us/networking/infiniband-adapters/ (ConnectX-6, 200 Gb/s)",
         "200 Gb/s = 25 GB/s per port per direction"),
    Link("100 GbE", 12.5, 12.5, "inter-node", "IEEE 802.3 100 Gb/s Ethernet",
         "100 Gb/s = 12.5 GB/s per direction"),
]}


def link_speed(name: str) -> Link:
    """Look up a :data:`LINK_SPEEDS` entry by name (case-insensitive)."""
    for key, link in LINK_SPEEDS.items():
        if isinstance(name, str) and key.lower() == name.lower():
            return link
    raise ValueError(f"name={name!r} is not a known link; valid choices: {', '.join(LINK_SPEEDS)}")


def allreduce_time_on_link(size_bytes: float, world_size: int, link_GBps: float, *,
                           alpha: float = 0.0) -> float:
    """Seconds for a ring all-reduce of ``size_bytes`` per rank over a link of ``link_GBps``
    (GB/s, 1e9 bytes/s): 2(N-1)/N * S / B (+ 2(N-1) alpha). Example: 2 GB of bf16 gradients
    (a 1B-parameter model) over 8 ranks: ~3.9 ms at 900 GB/s (NVLink H100 headline figure; with
    its 450 GB/s per direction ~7.8 ms), ~70 ms at 50 GB/s (InfiniBand NDR).
    Introduced in notebooks/13_interconnects_and_backends.ipynb."""
    bw = _pos_number("link_GBps", link_GBps) * 1e9
    return allreduce_time(size_bytes, world_size, alpha=alpha, bandwidth=bw, algorithm="ring")


# --------------------------------------------------------------------------------------------
# two-level all-reduce, and DDP's overlap of buckets with backward
# --------------------------------------------------------------------------------------------
def hierarchical_allreduce_breakdown(size_bytes: float, *, nodes: int, gpus_per_node: int,
                                     intra_GBps: float, inter_GBps: float,
                                     alpha_intra: float = 0.0,
                                     alpha_inter: float = 0.0) -> dict[str, float]:
    """Alpha-beta estimate of a two-level (hierarchical) all-reduce, phase by phase, beside flat
    rings over every GPU. Seconds.

    Assumed machine: N = ``nodes`` nodes of G = ``gpus_per_node`` GPUs; inside a node every GPU
    reaches every other at ``intra_GBps`` per direction (NVSwitch); each GPU has its own NIC of
    ``inter_GBps`` (as on DGX-class nodes). Bandwidths in GB/s (1e9 B/s), alphas in seconds,
    ``size_bytes`` S the gradient each GPU holds.

    Hierarchical: reduce-scatter in the node, all-reduce across nodes, all-gather in the node --
    Horovod's ``HOROVOD_HIERARCHICAL_ALLREDUCE`` (horovod/common/ops/nccl_operations.cc,
    NCCLHierarchicalAllreduce: ncclReduceScatter, MPI_Allreduce, ncclAllGather) and the "2D"
    all-reduce of Mikami et al. 2018, arXiv:1811.05233 (Jia et al. 2018, arXiv:1807.11205, use
    reduce/broadcast in the node instead). Ring terms from Thakur, Rabenseifner & Gropp 2005,
    IJHPCA 19(1):

    1. ring reduce-scatter over the G GPUs of a node: (G-1) (alpha_intra + S/G / B_intra)
       (``reduce_scatter_intra_s``);
    2. all-reduce of each GPU's S/G shard with the same GPU of the other nodes, the G shards in
       parallel on their own NICs: :func:`allreduce_time` (S/G, N) on the inter-node link
       (``allreduce_inter_s``);
    3. ring all-gather in the node: the same as step 1 (``all_gather_intra_s``).

    ``hierarchical_s`` = 1 + 2 + 3. ``flat_rings_s``: G rings over all N*G GPUs side by side, one
    per NIC, each carrying S/G (what NCCL's ring algorithm does across nodes):
    :func:`allreduce_time` (S/G, N*G) on the inter-node link (every ring step crosses a node
    boundary somewhere, and the slowest hop sets its pace). Same bandwidth term to within the
    intra-node phases; the difference is latency: 2(N-1) inter-node steps instead of 2(NG-1).
    Introduced in notebooks/13_interconnects_and_backends.ipynb.
    """
    s = _nonneg_number("size_bytes", size_bytes)
    n = _pos_int("nodes", nodes)
    g = _pos_int("gpus_per_node", gpus_per_node)
    b_intra = _pos_number("intra_GBps", intra_GBps) * 1e9
    b_inter = _pos_number("inter_GBps", inter_GBps) * 1e9
    # G-1 ring steps, each moving one S/G chunk over the intra-node link
    intra = (g - 1) * alpha_beta_time(s / g, alpha_s=alpha_intra, bandwidth=b_intra)
    inter = allreduce_time(s / g, n, alpha=alpha_inter, bandwidth=b_inter)
    flat = allreduce_time(s / g, n * g, alpha=alpha_inter, bandwidth=b_inter)
    return {"reduce_scatter_intra_s": intra, "allreduce_inter_s": inter,
            "all_gather_intra_s": intra, "hierarchical_s": 2 * intra + inter, "flat_rings_s": flat}


def hierarchical_allreduce_time(size_bytes: float, *, nodes: int, gpus_per_node: int,
                                intra_GBps: float, inter_GBps: float, alpha_intra: float = 0.0,
                                alpha_inter: float = 0.0) -> float:
    """Seconds of a hierarchical all-reduce (intra-node ring reduce-scatter, inter-node
    all-reduce of the S/G shards, intra-node ring all-gather): 2 (G-1) (alpha_intra +
    S/G / B_intra) + 2(N-1) alpha_inter + 2(N-1)/N (S/G) / B_inter. Arguments, units and sources
    as in :func:`hierarchical_allreduce_breakdown`; with one node it is the ring all-reduce over
    the node's G GPUs."""
    return hierarchical_allreduce_breakdown(
        size_bytes, nodes=nodes, gpus_per_node=gpus_per_node, intra_GBps=intra_GBps,
        inter_GBps=inter_GBps, alpha_intra=alpha_intra, alpha_inter=alpha_inter)["hierarchical_s"]


def ddp_exposed_comm_time(bucket_bytes: int, *, grad_bytes: int, backward_s: float,
                          alpha: float, beta: float) -> float:
    """Seconds of gradient communication left after the backward pass ends, for one bucket size.

    The model of DDP's gradient bucketing (Li et al. 2020, "PyTorch Distributed: Experiences on
    Accelerating Data Parallel Training", VLDB, arXiv:2006.15704, Sec. 3.2: buckets are
    all-reduced as soon as they are full, overlapping the rest of backward) with Hockney's
    alpha-beta cost per call (:func:`alpha_beta_time`):

    * backward produces ``grad_bytes`` of gradient at a steady rate over ``backward_s`` seconds;
    * gradients are cut, in the order they are produced, into buckets of ``bucket_bytes`` (the
      last bucket holds what is left, so there are ceil(grad_bytes / bucket_bytes) buckets);
    * a bucket's all-reduce can start when its last byte is produced *and* the previous
      bucket's all-reduce has finished (one communication channel), and takes
      ``alpha + beta * bytes`` seconds (``alpha`` in s, ``beta`` in s/byte);
    * the answer is ``max(0, end of the last all-reduce - backward_s)``, in seconds.

    Small buckets pay alpha many times; large buckets leave a long last all-reduce that nothing
    overlaps. This is the trade-off ``bucket_cap_mb`` sets in DDP.
    Introduced in notebooks/13_interconnects_and_backends.ipynb.
    """
    b = _pos_int("bucket_bytes", bucket_bytes)
    g = _pos_int("grad_bytes", grad_bytes)
    backward_s = _nonneg_number("backward_s", backward_s)
    alpha = _nonneg_number("alpha", alpha)
    beta = _nonneg_number("beta", beta)
    comm_free = 0.0  # when the channel finishes its previous all-reduce
    produced = 0
    while produced < g:
        size = min(b, g - produced)
        produced += size
        ready = backward_s * produced / g
        comm_free = max(ready, comm_free) + alpha + beta * size
    return max(0.0, comm_free - backward_s)


# --------------------------------------------------------------------------------------------
# FLOPs and roofline
# --------------------------------------------------------------------------------------------
def matmul_flops(m: int, n: int, k: int) -> int:
    """FLOPs of an (m x k) @ (k x n) matmul: 2mnk (one multiply and one add per term)."""
    return 2 * _nonneg_int("m", m) * _nonneg_int("n", n) * _nonneg_int("k", k)


def matmul_bytes(m: int, n: int, k: int, *, dtype_bytes: int = 4) -> int:
    """Bytes an (m x k) @ (k x n) matmul moves to and from memory if it reads A and B once and
    writes C once: (mk + kn + mn) * dtype_bytes -- the minimum traffic, reached when the
    operands fit in cache (Williams, Waterman & Patterson 2009, "Roofline", CACM 52(4)).
    Introduced in notebooks/02_batch_size_and_accumulation.ipynb."""
    m, n, k = _nonneg_int("m", m), _nonneg_int("n", n), _nonneg_int("k", k)
    return _pos_int("dtype_bytes", dtype_bytes) * (m * k + k * n + m * n)


#: FLOPs per element of the elementwise operations the roofline of unit 02 places, counted from
#: their formulas: GELU (erf form, torch.nn.functional.gelu) x * 0.5 * (1 + erf(x / sqrt 2)):
#: ~8 (erf itself is a short polynomial); LayerNorm: mean 1, variance 3, normalize 2, scale and
#: shift 2 = 8.
ELEMENTWISE_FLOPS = {"gelu": 8, "layernorm": 8}


class ElementwiseCost(NamedTuple):
    """Work and traffic of an elementwise operation: ``flops`` (FLOPs) and ``bytes`` (bytes)."""

    flops: int | float
    bytes: int


def elementwise_cost(numel: int, *, flops_per_element: float | str,
                     dtype_bytes: int = 4) -> ElementwiseCost:
    """FLOPs and bytes of an elementwise op over ``numel`` elements that reads its input once and
    writes its output once: ``flops = flops_per_element * numel``, ``bytes = 2 * numel *
    dtype_bytes`` (small operands such as LayerNorm's weight and bias are not counted).

    ``flops_per_element``: a number, or the name of an op in :data:`ELEMENTWISE_FLOPS`
    ("gelu", "layernorm"). Returns an :class:`ElementwiseCost` ``(flops, bytes)``; flops is an
    int when it is whole. Roofline accounting of Williams, Waterman & Patterson 2009.
    Introduced in notebooks/02_batch_size_and_accumulation.ipynb.
    """
    n = _nonneg_int("numel", numel)
    if isinstance(flops_per_element, str):
        per = ELEMENTWISE_FLOPS[_choice("flops_per_element", flops_per_element, ELEMENTWISE_FLOPS)]
    else:
        per = _nonneg_number("flops_per_element", flops_per_element)
    flops = per * n
    if isinstance(flops, float) and flops.is_integer():
        flops = int(flops)
    return ElementwiseCost(flops, 2 * n * _pos_int("dtype_bytes", dtype_bytes))


def transformer_training_flops(n_params: int, tokens: int) -> int:
    """Training FLOPs of a dense transformer: 6 N D (2 forward + 4 backward per parameter per
    token; Kaplan et al. 2020, arXiv:2001.08361 Sec. 2.1; attention FLOPs ignored)."""
    return 6 * _nonneg_int("n_params", n_params) * _nonneg_int("tokens", tokens)


def arithmetic_intensity(flops: float, bytes_moved: float) -> float:
    """FLOPs per byte moved to/from memory (Williams, Waterman & Patterson 2009, "Roofline")."""
    return _nonneg_number("flops", flops) / _pos_number("bytes_moved", bytes_moved)


def matmul_arithmetic_intensity(m: int, n: int, k: int, *, dtype_bytes: int = 4) -> float:
    """Arithmetic intensity of an (m x k) @ (k x n) matmul that reads A and B once and writes C
    once: 2mnk / (dtype_bytes (mk + kn + mn)) FLOPs/byte (:func:`matmul_flops` over
    :func:`matmul_bytes`)."""
    return arithmetic_intensity(matmul_flops(m, n, k), matmul_bytes(m, n, k, dtype_bytes=dtype_bytes))


def ridge_point(peak_flops: float, mem_bandwidth: float) -> float:
    """Intensity (FLOPs/byte) where a kernel turns from memory-bound to compute-bound:
    peak FLOP/s / memory bandwidth (bytes/s)."""
    return _pos_number("peak_flops", peak_flops) / _pos_number("mem_bandwidth", mem_bandwidth)


def attainable_flops(intensity: float, peak_flops: float, mem_bandwidth: float) -> float:
    """Roofline: attainable FLOP/s = min(peak, intensity x bandwidth)."""
    return min(_pos_number("peak_flops", peak_flops),
               _nonneg_number("intensity", intensity) * _pos_number("mem_bandwidth", mem_bandwidth))


def roofline_time(flops: float, bytes_moved: float, peak_flops: float, mem_bandwidth: float) -> float:
    """Lower bound on a kernel's time in s: max(flops / peak, bytes / bandwidth)."""
    return max(_nonneg_number("flops", flops) / _pos_number("peak_flops", peak_flops),
               _nonneg_number("bytes_moved", bytes_moved) / _pos_number("mem_bandwidth", mem_bandwidth))


# --------------------------------------------------------------------------------------------
# formatting
# --------------------------------------------------------------------------------------------
_UNITS = {"B": 1, "KiB": KiB, "MiB": MiB, "GiB": GiB, "TiB": 2**40,
          "KB": 10**3, "MB": 10**6, "GB": GB, "TB": 10**12}


def fmt_bytes(n: float, unit: str = "auto", *, digits: int = 2) -> str:
    """Format a byte count with its unit: ``unit="auto"`` picks the largest binary unit
    (KiB/MiB/GiB/TiB = powers of 1024) that keeps the number >= 1; or force one of
    B, KiB, MiB, GiB, TiB (1024-based) or KB, MB, GB, TB (1000-based, as papers and vendors use).

    >>> fmt_bytes(3 * 2**30)
    '3.00 GiB'
    >>> fmt_bytes(120e9, "GB", digits=1)
    '120.0 GB'
    """
    if isinstance(n, bool) or not isinstance(n, numbers.Real):
        raise TypeError(f"n must be a number of bytes, got {n!r} ({type(n).__name__})")
    if unit == "auto":
        unit = "B"
        for name in ("KiB", "MiB", "GiB", "TiB"):
            if abs(n) >= _UNITS[name]:
                unit = name
    if unit not in _UNITS:
        raise ValueError(f"unit={unit!r} is not supported; valid choices: auto, {', '.join(_UNITS)}")
    n = float(n) if not isinstance(n, int) else n
    if unit == "B" and float(n).is_integer():
        return f"{int(n)} B"
    return f"{n / _UNITS[unit]:.{digits}f} {unit}"


def breakdown_residual(measured: Mapping[str, float], predicted: Mapping[str, float]) -> dict[str, float]:
    """measured - predicted for every key in either dict (missing keys count as 0), in bytes."""
    keys = list(dict.fromkeys([*predicted, *measured]))
    return {k: measured.get(k, 0) - predicted.get(k, 0) for k in keys}
