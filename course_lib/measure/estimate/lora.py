"""Parameter-efficient fine-tuning formulas: LoRA parameter counts, NF4 bytes, fine-tuning memory.

Introduced in notebooks/07_lora_qlora.ipynb. Sources: Hu et al. 2021, LoRA (arXiv:2106.09685);
Dettmers et al. 2023, QLoRA (arXiv:2305.14314); Touvron et al. 2023, Llama 2 (arXiv:2307.09288)
for the shapes.
"""

from __future__ import annotations

from collections.abc import Iterable
from fractions import Fraction
from typing import Any, Literal

from course_lib import validate as _v
from course_lib.measure.estimate.memory import Optimizer, Precision, model_state_bytes
from course_lib.measure.estimate.units import exact

__all__ = [
    "FinetuneMethod",
    "lora_params",
    "LLAMA_LINEARS",
    "llama_linear_shapes",
    "transformer_lora_params",
    "NF4_BLOCKSIZE",
    "NF4_BLOCKSIZE2",
    "nf4_scale_bits_per_param",
    "nf4_bytes",
    "FINETUNE_METHODS",
    "finetune_state_bytes",
]


def lora_params(shapes: Iterable[Any], *, r: int) -> int:
    """Trainable parameters of LoRA at rank ``r`` on layers of the given ``(d_in, d_out)`` shapes:
    ``r * sum(d_in + d_out)`` (A is r x d_in, B is d_out x r; Hu et al. 2021, Sec. 4.1).

    >>> lora_params([(4096, 4096)], r=8)  # one 4096 x 4096 projection
    65536
    """
    r = _v.count("r", r, minimum=1)
    total = 0
    for i, shape in enumerate(shapes):
        try:
            d_in, d_out = shape
        except (TypeError, ValueError):
            raise ValueError(f"shapes[{i}] = {shape!r}: expected a pair (d_in, d_out)") from None
        d_in, d_out = (
            _v.count(f"shapes[{i}][0]", d_in, minimum=1),
            _v.count(f"shapes[{i}][1]", d_out, minimum=1),
        )
        if r > min(d_in, d_out):
            raise ValueError(
                f"r = {r}: expected r <= min(d_in, d_out) = {min(d_in, d_out)} "
                f"for shapes[{i}] = ({d_in}, {d_out})"
            )
        total += r * (d_in + d_out)
    return total


#: the seven linear layers of a Llama block, as (d_in, d_out) in terms of hidden h, SwiGLU width f
#: and key/value width kv (= h without grouped-query attention)
LLAMA_LINEARS = {
    "q": ("h", "h"),
    "k": ("h", "kv"),
    "v": ("h", "kv"),
    "o": ("h", "h"),
    "gate": ("h", "f"),
    "up": ("h", "f"),
    "down": ("f", "h"),
}


def llama_linear_shapes(
    *,
    hidden: int,
    ffn: int,
    layers: int,
    targets: Iterable[str] | str = ("q", "v"),
    kv_hidden: int | None = None,
) -> list[tuple[int, int]]:
    """``(d_in, d_out)`` of every targeted linear layer of a Llama-shaped model, layer by layer.

    ``targets``: names from :data:`LLAMA_LINEARS` (q, k, v, o, gate, up, down) or ``"all"``;
    ``kv_hidden``: width of k and v (grouped-query attention), default ``hidden``.
    Llama-2-7B: hidden 4096, ffn 11008, layers 32.
    """
    h, f = _v.count("hidden", hidden, minimum=1), _v.count("ffn", ffn, minimum=1)
    n = _v.count("layers", layers, minimum=1)
    kv = h if kv_hidden is None else _v.count("kv_hidden", kv_hidden, minimum=1)
    names = (
        list(LLAMA_LINEARS) if targets == "all" else _v.choices("targets", targets, LLAMA_LINEARS)
    )
    width = {"h": h, "f": f, "kv": kv}
    one = [(width[LLAMA_LINEARS[t][0]], width[LLAMA_LINEARS[t][1]]) for t in names]
    return one * n


def transformer_lora_params(
    *,
    hidden: int,
    ffn: int,
    layers: int,
    r: int,
    targets: Iterable[str] | str = ("q", "v"),
    kv_hidden: int | None = None,
) -> int:
    """LoRA parameters of a Llama-shaped model: :func:`lora_params` of :func:`llama_linear_shapes`.

    Llama-2-7B at r = 8: q, v -> 4,194,304; all seven linears -> 19,988,480.
    """
    return lora_params(
        llama_linear_shapes(
            hidden=hidden,
            ffn=ffn,
            layers=layers,
            targets=targets,
            kv_hidden=kv_hidden,
        ),
        r=r,
    )


#: bitsandbytes' / QLoRA's block of weights sharing one absmax scale
NF4_BLOCKSIZE = 64
#: double quantization: block of 8-bit scales sharing one fp32 scale
NF4_BLOCKSIZE2 = 256


def nf4_scale_bits_per_param(
    *, blocksize: int = NF4_BLOCKSIZE, double_quant: bool = True, blocksize2: int = NF4_BLOCKSIZE2
) -> int | float:
    """Bits of scale per weight: 32 / blocksize (fp32 absmax), or with double quantization
    8 / blocksize + 32 / (blocksize * blocksize2). QLoRA (Sec. 3): 0.5 -> 0.127 bit per parameter."""
    b = _v.count("blocksize", blocksize, minimum=1)
    if not double_quant:
        return exact(Fraction(32, b))
    b2 = _v.count("blocksize2", blocksize2, minimum=1)
    return exact(Fraction(8, b) + Fraction(32, b * b2))


def nf4_bytes(
    n_params: int,
    *,
    blocksize: int = NF4_BLOCKSIZE,
    double_quant: bool = True,
    blocksize2: int = NF4_BLOCKSIZE2,
) -> dict[str, int]:
    """Bytes of one weight tensor of ``n_params`` values stored in NF4 (bitsandbytes' layout):
    ``codes`` ceil(n / 2) (4 bits each), ``scales`` one absmax per block (fp32, or uint8 with
    double quantization), ``scales_of_scales`` (double quantization: an fp32 absmax per
    ``blocksize2`` scales plus the fp32 mean subtracted from them), ``total``. The shared code
    tables (64 B and 1 KiB) are left out. For a whole model this treats the weights as one
    tensor: per-tensor rounding adds at most a few bytes per tensor."""
    n = _v.count("n_params", n_params)
    b = _v.count("blocksize", blocksize, minimum=1)
    blocks = -(-n // b)
    out = {"codes": -(-n // 2)}
    if double_quant:
        b2 = _v.count("blocksize2", blocksize2, minimum=1)
        out["scales"] = blocks
        out["scales_of_scales"] = 4 * -(-blocks // b2) + 4
    else:
        out["scales"] = 4 * blocks
        out["scales_of_scales"] = 0
    out["total"] = sum(out.values())
    return out


#: what is trained and how the frozen base is stored
FinetuneMethod = Literal["full", "lora", "qlora"]
FINETUNE_METHODS: tuple[FinetuneMethod, ...] = ("full", "lora", "qlora")


def finetune_state_bytes(
    n_params: int,
    *,
    method: FinetuneMethod,
    lora_params: int = 0,
    precision: Precision = "bf16-mixed",
    optimizer: Optimizer = "adam",
    double_quant: bool = True,
) -> dict[str, int]:
    """Model-state bytes (no activations) of fine-tuning a model of ``n_params`` parameters.

    * ``full``: every parameter trained: :func:`model_state_bytes` (16 B/param for bf16-mixed Adam);
    * ``lora``: the base frozen in 16-bit (2 B/param; 4 with ``precision="fp32"``) with no
      gradient and no optimizer state, plus ``lora_params`` trained with the full recipe;
    * ``qlora``: the base frozen in NF4 (:func:`nf4_bytes`, double quantization by default),
      plus the adapters as in ``lora``.

    Returns ``{"base", "params", "grads", "optimizer", "master", "total"}``: ``base`` is the
    frozen weights, the others are of the trained parameters (ints, bytes).
    """
    n = _v.count("n_params", n_params)
    m = _v.choice("method", method, FINETUNE_METHODS, case_insensitive=True)
    k = _v.count("lora_params", lora_params)
    if m == "full":
        trained, base = model_state_bytes(n, precision=precision, optimizer=optimizer), 0
    else:
        if k == 0:
            raise ValueError(
                f"lora_params = 0: expected the adapter's parameter count for method {m!r}"
            )
        trained = model_state_bytes(k, precision=precision, optimizer=optimizer)
        base = (
            (4 if precision == "fp32" else 2) * n
            if m == "lora"
            else nf4_bytes(n, double_quant=double_quant)["total"]
        )
    out = {
        "base": base,
        **{key: trained[key] for key in ("params", "grads", "optimizer", "master")},
    }
    out["total"] = sum(out.values())
    return out
