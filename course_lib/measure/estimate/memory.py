"""Memory formulas: dtypes, model state, optimizer state (8-bit Adam included).

ZeRO sharding is in ``zero``, activations in ``activations``. Introduced in
notebooks/01_backprop_memory.ipynb and notebooks/04_optimizer_memory.ipynb."""

from __future__ import annotations

import numbers
from collections.abc import Iterable
from typing import Any, Literal

from course_lib import validate as _v

__all__ = [
    "dtype_bytes",
    "Precision",
    "PRECISIONS",
    "Optimizer",
    "OPTIMIZERS",
    "STATE_TENSORS_PER_PARAM",
    "optimizer_state_bytes_per_param",
    "model_state_bytes",
    "ADAM8BIT_MIN_8BIT_SIZE",
    "ADAM8BIT_BLOCK_SIZE",
    "adam8bit_state_bytes",
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
        f"dtype = {_v.describe(dtype)}: expected a torch.dtype or one of "
        + ", ".join(sorted(_DTYPE_BYTES))
    )


#: precision recipes accepted by :func:`model_state_bytes`
#: the training precisions of the course (one table: ``techniques.precision.MODES`` is this)
Precision = Literal["fp32", "bf16-mixed", "fp16-mixed", "bf16-true"]
PRECISIONS: tuple[Precision, ...] = ("fp32", "bf16-mixed", "fp16-mixed", "bf16-true")

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
Optimizer = Literal["sgd", "momentum", "rmsprop", "adagrad", "adam", "adamw", "adam8bit"]
OPTIMIZERS: tuple[Optimizer, ...] = (
    "sgd",
    "momentum",
    "rmsprop",
    "adagrad",
    "adam",
    "adamw",
    "adam8bit",
)
assert OPTIMIZERS == tuple(_OPT_STATE_TENSORS)
#: state tensors each optimizer keeps per parameter
STATE_TENSORS_PER_PARAM = dict(_OPT_STATE_TENSORS)
# optimizers whose torch.optim implementation keeps a scalar ``step`` tensor per parameter tensor
_STEP_COUNTER = {"adam", "adamw", "adagrad", "rmsprop"}


def optimizer_state_bytes_per_param(
    optimizer: Optimizer, *, state_dtype_bytes: int | None = None
) -> int:
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
    precision: Precision = "fp32",
    optimizer: Optimizer = "adam",
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
    unorm = _v.number("max_unorm", max_unorm, minimum=0)  # 0 disables the update-norm clip
    if isinstance(param_numels, (str, bytes, numbers.Number)) or not isinstance(
        param_numels, Iterable
    ):
        raise TypeError(
            f"param_numels = {_v.describe(param_numels)}: expected an iterable of element "
            "counts (one per parameter tensor)"
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
    if unorm > 0:
        out["unorm"] = 4 * n_tensors
    out["total"] = sum(out.values())
    return out
