"""Memory formulas: dtypes, model state, optimizer state, ZeRO sharding, activations.

Introduced in notebooks/01_backprop_memory.ipynb and notebooks/04_optimizer_memory.ipynb."""

from __future__ import annotations

import numbers
from fractions import Fraction
from typing import Any, Iterable, Sequence

from course_lib import validate as _v
from course_lib.measure.estimate.units import exact

__all__ = [
    "dtype_bytes",
    "PRECISIONS",
    "OPTIMIZERS",
    "STATE_TENSORS_PER_PARAM",
    "optimizer_state_bytes_per_param",
    "model_state_bytes",
    "ADAM8BIT_MIN_8BIT_SIZE",
    "ADAM8BIT_BLOCK_SIZE",
    "adam8bit_state_bytes",
    "zero_state_breakdown_per_rank",
    "zero_bytes_per_rank",
    "zero_padding",
    "zero_layout_bytes_per_rank",
    "MLP_ACTIVATION_SAVES",
    "activation_bytes_mlp",
    "activation_bytes_transformer_layer",
    "activation_bytes_gpt",
]

# --------------------------------------------------------------------------------------------
# dtypes, model state, optimizer state
# --------------------------------------------------------------------------------------------
_DTYPE_BYTES = {
    "float64": 8,
    "fp64": 8,
    "double": 8,
    "float32": 4,
    "fp32": 4,
    "float": 4,
    "tf32": 4,
    "float16": 2,
    "fp16": 2,
    "half": 2,
    "bfloat16": 2,
    "bf16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "fp8": 1,
    "int64": 8,
    "long": 8,
    "int32": 4,
    "int": 4,
    "int16": 2,
    "short": 2,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
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
    raise ValueError(
        f"dtype = {dtype!r}: expected a torch.dtype or one of {', '.join(sorted(_DTYPE_BYTES))}"
    )


#: precision recipes accepted by :func:`model_state_bytes`
#: the training precisions of the course (one table: ``techniques.precision.MODES`` is this)
PRECISIONS = ("fp32", "bf16-mixed", "fp16-mixed", "bf16-true")

# number of per-parameter state tensors each optimizer keeps (torch.optim, defaults)
_OPT_STATE_TENSORS = {
    "sgd": 0,  # plain SGD (momentum=0): no state
    "momentum": 1,  # SGD with momentum: momentum_buffer
    "rmsprop": 1,  # square_avg (momentum=0, centered=False)
    "adagrad": 1,  # sum
    "adam": 2,  # exp_avg, exp_avg_sq
    "adamw": 2,  # exp_avg, exp_avg_sq
    "adam8bit": 2,  # exp_avg, exp_avg_sq quantized to 8 bits (bitsandbytes)
}
#: the optimizers of the course (one table: ``techniques.optim.OPTIMIZERS`` is this)
OPTIMIZERS = tuple(_OPT_STATE_TENSORS)
#: state tensors each optimizer keeps per parameter
STATE_TENSORS_PER_PARAM = dict(_OPT_STATE_TENSORS)
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
    opt = _v.choice("optimizer", optimizer, OPTIMIZERS, case_insensitive=True)
    if opt == "adam8bit":
        if state_dtype_bytes not in (None, 1):
            raise ValueError(
                f"state_dtype_bytes = {state_dtype_bytes!r}: expected None or 1 "
                "(8-bit state) for optimizer 'adam8bit'"
            )
        return 2
    width = (
        4
        if state_dtype_bytes is None
        else _v.count("state_dtype_bytes", state_dtype_bytes, minimum=1)
    )
    return _OPT_STATE_TENSORS[opt] * width


def model_state_bytes(
    n_params: int,
    *,
    precision: str = "fp32",
    optimizer: str = "adam",
    n_param_tensors: int = 0,
    state_dtype_bytes: int | None = None,
) -> dict[str, int]:
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

    ``state_dtype_bytes`` overrides the width of each optimizer state value. The one use: the
    "12 bytes per parameter" accounting, ``precision="bf16-true", state_dtype_bytes=4`` -- bf16
    params and grads with fp32 Adam moments and no master copy, 2Ψ + 2Ψ + 8Ψ (an optimizer that
    keeps fp32 moments for bf16 weights, e.g. ``techniques.optim.Adam(state_dtype=torch.float32)``;
    notebooks/04_optimizer_memory.ipynb measures it).
    """
    n = _v.count("n_params", n_params)
    prec = _v.choice("precision", precision, PRECISIONS, case_insensitive=True)
    opt = _v.choice("optimizer", optimizer, OPTIMIZERS, case_insensitive=True)
    n_tensors = _v.count("n_param_tensors", n_param_tensors)
    param_b = 4 if prec == "fp32" else 2
    master_b = 4 if prec in ("fp16-mixed", "bf16-mixed") else 0
    state_width = 2 if prec == "bf16-true" else 4
    if state_dtype_bytes is not None:
        if opt == "adam8bit":
            raise ValueError(
                f"state_dtype_bytes = {state_dtype_bytes!r}: expected None for optimizer "
                "'adam8bit' (its state is 8-bit by definition)"
            )
        state_width = _v.count("state_dtype_bytes", state_dtype_bytes, minimum=1)
    opt_b = optimizer_state_bytes_per_param(
        opt, state_dtype_bytes=None if opt == "adam8bit" else state_width
    )
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


def adam8bit_state_bytes(
    param_numels: Iterable[Any],
    *,
    min_8bit_size: int = ADAM8BIT_MIN_8BIT_SIZE,
    block_size: int = ADAM8BIT_BLOCK_SIZE,
    max_unorm: float = 0.0,
) -> dict[str, int]:
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
    min_size = _v.count("min_8bit_size", min_8bit_size)
    block = _v.count("block_size", block_size, minimum=1)
    if isinstance(max_unorm, bool) or not isinstance(max_unorm, numbers.Real) or max_unorm < 0:
        raise ValueError(
            f"max_unorm = {max_unorm!r}: expected a number >= 0 (0 disables the update-norm clip)"
        )
    if isinstance(param_numels, (str, bytes, numbers.Number)) or not isinstance(
        param_numels, Iterable
    ):
        raise TypeError(
            f"param_numels must be an iterable of element counts (one per parameter tensor), "
            f"got {param_numels!r} ({type(param_numels).__name__})"
        )
    out = {"uint8_states": 0, "fp32_states": 0, "absmax": 0, "code_books": 0, "unorm": 0}
    n_tensors = 0
    for i, item in enumerate(param_numels):
        n = item.numel() if callable(getattr(item, "numel", None)) else item
        n = _v.count(f"param_numels[{i}]", n)
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
def zero_state_breakdown_per_rank(
    n_params: int,
    *,
    stage: int,
    world_size: int,
    k: int = 12,
    param_bytes: int = 2,
    grad_bytes: int = 2,
) -> dict[str, int | float]:
    """Model-state bytes per rank under ZeRO, split into params / grads / optimizer (+ total).

    Accounting of the ZeRO paper (Rajbhandari et al. 2019, arXiv:1910.02054, Sec. 5 and
    Figure 1): fp16 params 2Ψ, fp16 grads 2Ψ, optimizer states KΨ (K = 12 for mixed-precision
    Adam: fp32 master, momentum, variance). Stage 0 is plain data parallelism (DDP, everything
    replicated); stage 1 (P_os) shards the optimizer states, stage 2 (P_os+g) also the gradients,
    stage 3 (P_os+g+p) also the parameters, over ``world_size`` = N_d ranks.
    ``param_bytes`` / ``grad_bytes`` (default 2, fp16/bf16) change the widths of the replicated
    parameters and gradients: plain fp32 training with AdamW is ``param_bytes=4, grad_bytes=4,
    k=8`` (no master copy), which is what notebooks/10_zero_fsdp.ipynb measures on CPU.

    Values are bytes: int when the shard divides evenly, else float.
    """
    n = _v.count("n_params", n_params)
    if stage not in (0, 1, 2, 3) or isinstance(stage, bool):
        raise ValueError(f"stage = {stage!r}: expected one of 0, 1, 2, 3")
    nd = _v.count("world_size", world_size, minimum=1)
    k = _v.count("k", k)
    pb = _v.count("param_bytes", param_bytes, minimum=1)
    gb = _v.count("grad_bytes", grad_bytes, minimum=1)
    shard = Fraction(1, nd)
    params = Fraction(pb * n) * (shard if stage >= 3 else 1)
    grads = Fraction(gb * n) * (shard if stage >= 2 else 1)
    opt = Fraction(k * n) * (shard if stage >= 1 else 1)
    return {
        "params": exact(params),
        "grads": exact(grads),
        "optimizer": exact(opt),
        "total": exact(params + grads + opt),
    }


def zero_bytes_per_rank(
    n_params: int,
    *,
    stage: int,
    world_size: int,
    k: int = 12,
    param_bytes: int = 2,
    grad_bytes: int = 2,
) -> int | float:
    """Total model-state bytes per rank under ZeRO stage 0-3 (see
    :func:`zero_state_breakdown_per_rank`). Reproduces Figure 1 of arXiv:1910.02054:
    Ψ = 7.5e9, N_d = 64 gives 120, 31.4, 16.6 and 1.9 GB for stages 0-3.
    """
    return zero_state_breakdown_per_rank(
        n_params,
        stage=stage,
        world_size=world_size,
        k=k,
        param_bytes=param_bytes,
        grad_bytes=grad_bytes,
    )["total"]


def _unit_numels(units: Any) -> list[list[int]]:
    if isinstance(units, (str, bytes, numbers.Number)) or not isinstance(units, Iterable):
        raise TypeError(
            f"units = {units!r}: expected a list of units, each a list of the "
            "element counts of its parameter tensors, e.g. [[256, 32], [64, 2]]"
        )
    out = []
    for i, unit in enumerate(units):
        if isinstance(unit, (str, bytes)) or not isinstance(unit, Iterable):
            unit = [unit]
        numels = [_v.count(f"units[{i}][{j}]", n) for j, n in enumerate(unit)]
        if not numels:
            raise ValueError(f"units[{i}] = []: expected at least one parameter tensor per unit")
        out.append(numels)
    return out


def zero_padding(units: Any, world_size: int) -> int:
    """Elements of zero padding when each unit (a list of parameter-tensor sizes, flattened end
    to end) is padded to a multiple of ``world_size`` so it cuts into equal shards:
    sum over units of ceil(Psi_u / N) * N - Psi_u (at most N-1 per unit). torch's FSDP2 pads
    each parameter tensor's dim 0 instead; DeepSpeed pads its flat buffers the same way.

    >>> zero_padding([[7], [10, 2]], 4)  # 7 -> 8, 12 -> 12
    1
    """
    nd = _v.count("world_size", world_size, minimum=1)
    return sum(-(-sum(u) // nd) * nd - sum(u) for u in _unit_numels(units))


def zero_layout_bytes_per_rank(
    units: Any,
    *,
    stage: int,
    world_size: int,
    param_bytes: int = 4,
    grad_bytes: int = 4,
    state_bytes: int = 8,
    step_bytes: int = 4,
) -> dict[str, int]:
    """Exact model-state bytes per rank of ``course_lib.parallel.zero.ZeroDataParallel`` after
    ``step()`` (before ``zero_grad``), with every unit padded (:func:`zero_padding`).

    ``units``: per unit (a module that owns parameters), the element counts of its parameter
    tensors. With s_u = ceil(Psi_u / N) the shard of unit u, P = sum_u N s_u the padded size:

    ========  ==================  ==============  ================  ===============
    stage     params              grads           optimizer         (per unit)
    ========  ==================  ==============  ================  ===============
    0         pb Psi              gb Psi          sb Psi + 4 T      T = tensors
    1         pb P                gb Psi          sb sum s_u + 4 U  U = units
    2         pb P                gb sum s_u      sb sum s_u + 4 U
    3         pb sum s_u          gb sum s_u      sb sum s_u + 4 U
    ========  ==================  ==============  ================  ===============

    pb/gb/sb: bytes per parameter, per gradient, of optimizer state per element (AdamW: m and v
    in fp32, 8); ``step_bytes``: torch.optim's scalar ``step`` tensor per optimized tensor (one per
    parameter tensor at stage 0, one per shard otherwise). Returns ``{"params", "grads",
    "optimizer", "total", "padding"}``; ``padding`` is the part of the total that is padding.
    Introduced in notebooks/10_zero_fsdp.ipynb.
    """
    if isinstance(stage, bool) or stage not in (0, 1, 2, 3):
        raise ValueError(f"stage = {stage!r}: expected one of 0, 1, 2, 3")
    nd = _v.count("world_size", world_size, minimum=1)
    pb, gb = (
        _v.count("param_bytes", param_bytes, minimum=1),
        _v.count("grad_bytes", grad_bytes, minimum=1),
    )
    sb, tb = _v.count("state_bytes", state_bytes), _v.count("step_bytes", step_bytes)
    units = _unit_numels(units)
    psi = sum(map(sum, units))
    shards = sum(-(-sum(u) // nd) for u in units)  # sum of s_u

    def table(per_rank, full):  # per_rank: a shard's elements; full: a full copy's elements
        if stage == 0:
            return pb * psi, gb * psi, sb * psi + tb * sum(map(len, units))
        return (
            pb * (per_rank if stage == 3 else full),
            gb * (per_rank if stage >= 2 else psi),
            sb * per_rank + tb * len(units),
        )

    params, grads, opt = table(shards, nd * shards)
    ideal = sum(table(Fraction(psi, nd), psi))  # the same without padding
    out = {
        "params": params,
        "grads": grads,
        "optimizer": opt,
        "padding": exact(params + grads + opt - ideal),
    }
    out["total"] = out["params"] + out["grads"] + out["optimizer"]
    return {k: out[k] for k in ("params", "grads", "optimizer", "total", "padding")}


# --------------------------------------------------------------------------------------------
# activations
# --------------------------------------------------------------------------------------------
#: activation functions of our MLP and what autograd saves for each ("input" = pre-activation z,
#: "output" = activation u). From the derivative formulas in torch/csrc/autograd/derivatives.yaml.
MLP_ACTIVATION_SAVES = {
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
    activation: str = "relu",
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
    widths = [_v.count("widths[i]", w, minimum=1) for w in widths]
    if len(widths) < 2:
        raise ValueError(f"widths={widths!r} needs at least 2 entries (in and out features)")
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
    bytes_per_value: int = 2,
    dropout: bool = True,
    recompute: str = "none",
) -> int:
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
    s, b = _v.count("seq", seq, minimum=1), _v.count("batch", batch, minimum=1)
    h, a = _v.count("hidden", hidden, minimum=1), _v.count("heads", heads, minimum=1)
    p = _v.count("bytes_per_value", bytes_per_value, minimum=1)
    rec = _v.choice("recompute", recompute, ("none", "selective", "full"), case_insensitive=True)
    if rec == "full":
        return p * s * b * h
    sbh, as2b = s * b * h, a * s * s * b
    values = 16 * sbh + (2 if dropout else 1) * as2b
    masks = (2 * sbh + as2b) if dropout else 0
    if rec == "selective":
        values -= (2 if dropout else 1) * as2b
        masks -= as2b if dropout else 0
    return p * values + masks


def activation_bytes_gpt(
    config: Any,
    batch: int,
    seq: int | None = None,
    *,
    dtype_bytes: int = 4,
    include_logits: bool = True,
) -> int:
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
        raise TypeError(
            f"config must be a course_lib.models.GPTConfig, got {type(config).__name__} "
            "(for other shapes use activation_bytes_transformer_layer)"
        )
    if getattr(config, "dropout", 0.0):
        raise ValueError(
            f"config.dropout = {config.dropout!r}: expected 0.0, for which the count is exact "
            "(dropout adds masks; see activation_bytes_transformer_layer)"
        )
    from_config = {k: getattr(config, k) for k in names}
    B = _v.count("batch", batch, minimum=1)
    T = from_config["block_size"] if seq is None else _v.count("seq", seq, minimum=1)
    C, nh, L, V = (
        from_config["n_embd"],
        from_config["n_head"],
        from_config["n_layer"],
        from_config["vocab_size"],
    )
    if T > from_config["block_size"]:
        raise ValueError(
            f"seq = {T}: expected at most config.block_size = {from_config['block_size']}"
        )
    per_layer = 16 * B * T * C + 4 * B * T + nh * B * T * T
    values = L * per_layer + 2 * B * T * C + 2 * B * T
    if include_logits:
        values += B * T * V
    return _v.count("dtype_bytes", dtype_bytes, minimum=1) * values
