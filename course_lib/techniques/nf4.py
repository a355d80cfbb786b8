"""4-bit NormalFloat (NF4): the frozen base of QLoRA, from scratch and through bitsandbytes.

Dettmers et al. 2023, "QLoRA: Efficient Finetuning of Quantized LLMs" (arXiv:2305.14314), Sec. 3:

* **NF4**: 16 code values placed at quantiles of N(0, 1), rescaled to [-1, 1], with an exact 0.
  Pretrained weights are roughly normal, so equal-probability bins waste no code on empty tails.
  The paper builds 8 positive values from the quantiles of ``linspace(1 - delta, 1/2, 9)`` and 7
  negative ones from ``linspace(1 - delta, 1/2, 8)``, delta = (1/32 + 1/30) / 2, dropping the
  duplicated 0: :func:`nf4_code` does exactly that (``torch.special.ndtri`` is the normal
  quantile function) and tests/techniques/test_nf4.py checks it against bitsandbytes' table.
* **Blockwise absmax**: each block of 64 consecutive values is divided by its largest |value|
  (one fp32 scale per block: 32 / 64 = 0.5 bit per parameter) and each value stored as the index
  of the nearest code (4 bits; two per byte).
* **Double quantization**: the fp32 scales are themselves quantized to 8 bits in blocks of 256
  (after subtracting their mean), with one fp32 scale per 256 scales: 8 / 64 + 32 / (64 * 256)
  = 0.127 bit per parameter instead of 0.5.

:func:`quantize_nf4` / :func:`dequantize_nf4` are ours (single level); :func:`nf4_linear` turns
an ``nn.Linear`` into ``bitsandbytes.nn.Linear4bit`` (the layer QLoRA trains on; it also runs on
CPU), and :func:`quantized_bytes` measures what such a layer really stores.

Introduced in notebooks/07_lora_qlora.ipynb.
"""

from __future__ import annotations

from typing import Iterable

import torch
from torch import nn

from course_lib import validate

__all__ = [
    "NF4_DELTA",
    "nf4_code",
    "quantize_nf4",
    "dequantize_nf4",
    "nf4_linear",
    "quantize_linears_",
    "quantized_bytes",
]

#: offset of the outermost quantiles: delta = (1/32 + 1/30) / 2 (QLoRA, Sec. 3 and Appendix E)
NF4_DELTA = (1 / 32 + 1 / 30) / 2


def nf4_code(dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The 16 NF4 values, ascending, in [-1, 1], built from normal quantiles (see module doc)."""
    q = torch.special.ndtri  # inverse CDF of N(0, 1)
    pos = q(torch.linspace(1 - NF4_DELTA, 0.5, 9, dtype=torch.float64))[:-1]  # 8 values > 0
    neg = -q(torch.linspace(1 - NF4_DELTA, 0.5, 8, dtype=torch.float64))[:-1]  # 7 values < 0
    values = torch.cat([neg, torch.zeros(1, dtype=torch.float64), pos]).sort().values  # (16,)
    return (values / values.abs().max()).to(dtype)


def _blocks(w: torch.Tensor, blocksize: int) -> torch.Tensor:
    blocksize = validate.count("blocksize", blocksize, minimum=2)
    validate.divisible("w.numel()", w.numel(), "blocksize", blocksize)
    return w.detach().reshape(-1, blocksize).float()  # (n_blocks, blocksize)


def quantize_nf4(w: torch.Tensor, *, blocksize: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """Our NF4: ``(packed, absmax)``. ``packed``: uint8 of w.numel() / 2 (two 4-bit codes per
    byte, first value in the high nibble, as bitsandbytes), ``absmax``: fp32, one per block."""
    blocks = _blocks(w, blocksize)  # (n_blocks, bs)
    absmax = blocks.abs().amax(dim=1)  # (n_blocks,)
    normed = blocks / absmax.clamp_min(torch.finfo(torch.float32).tiny)[:, None]  # in [-1, 1]
    code = nf4_code()
    mids = (code[1:] + code[:-1]) / 2  # (15,) decision thresholds between neighbouring codes
    idx = torch.bucketize(normed.reshape(-1), mids, right=True).to(torch.uint8)  # nearest code
    if idx.numel() % 2:
        idx = torch.cat([idx, idx.new_zeros(1)])
    packed = (idx[0::2] << 4) | idx[1::2]  # (n / 2,)
    return packed, absmax


def dequantize_nf4(
    packed: torch.Tensor,
    absmax: torch.Tensor,
    shape,
    *,
    blocksize: int = 64,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Inverse of :func:`quantize_nf4`: code value times its block's absmax, reshaped."""
    n = int(torch.Size(shape).numel())
    idx = torch.stack([packed >> 4, packed & 0xF], dim=1).reshape(-1)[:n].long()  # (n,)
    values = nf4_code()[idx].reshape(-1, blocksize) * absmax[:, None]  # (n_blocks, bs)
    return values.reshape(shape).to(dtype)


def nf4_linear(linear: nn.Linear, *, double_quant: bool = True, blocksize: int = 64) -> nn.Module:
    """A frozen ``bitsandbytes.nn.Linear4bit`` (NF4) holding ``linear``'s weight; the bias stays
    in its dtype, compute happens in the weight's original dtype. Works on CPU and CUDA."""
    from course_lib.runtime.compat import import_optional

    bnb = import_optional("bitsandbytes", extra="lora", needed_for="nf4_linear")

    if not isinstance(linear, nn.Linear):
        raise TypeError(f"linear must be an nn.Linear, got {type(linear).__name__}")
    w = linear.weight
    q = bnb.nn.Linear4bit(
        linear.in_features,
        linear.out_features,
        bias=linear.bias is not None,
        compute_dtype=w.dtype,
        compress_statistics=bool(double_quant),
        quant_type="nf4",
    )
    q.weight = bnb.nn.Params4bit(
        w.detach().clone(),
        requires_grad=False,
        blocksize=blocksize,
        compress_statistics=bool(double_quant),
        quant_type="nf4",
    )
    if linear.bias is not None:
        q.bias = nn.Parameter(linear.bias.detach().clone(), requires_grad=False)
    return q.to(w.device)  # moving a Params4bit to its device is what quantizes it


def quantize_linears_(
    model: nn.Module,
    targets: Iterable[str] | str,
    *,
    double_quant: bool = True,
    blocksize: int = 64,
) -> list[str]:
    """Replace the ``nn.Linear`` layers named by ``targets`` (last name component or dotted suffix,
    as in ``add_lora``) by NF4 :func:`nf4_linear` layers, in place; returns their names."""
    targets = [targets] if isinstance(targets, str) else list(targets)
    names = [
        n
        for n, m in model.named_modules()
        if isinstance(m, nn.Linear) and any(n == t or n.endswith("." + t) for t in targets)
    ]
    if not names:
        raise ValueError(f"targets = {targets!r}: no nn.Linear of {type(model).__name__} matches")
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(
            parent,
            child,
            nf4_linear(getattr(parent, child), double_quant=double_quant, blocksize=blocksize),
        )
    return names


def _storage_bytes(t: torch.Tensor, seen: set) -> int:
    key = (t.untyped_storage().data_ptr(), t.device.type)
    if key in seen:
        return 0
    seen.add(key)
    return t.untyped_storage().nbytes()


def quantized_bytes(layers: nn.Module | Iterable[nn.Module]) -> dict[str, int]:
    """Bytes a set of ``Linear4bit`` layers really store, read from their tensors (each storage
    counted once): ``codes`` (the packed 4-bit weights), ``scales`` (the absmax per block: fp32,
    or uint8 with double quantization), ``scales_of_scales`` (double quantization's fp32 absmax
    per 256 scales, and its offset), ``code_tables`` (the 16-value NF4 table and the 256-value
    8-bit table, shared storages counted once), ``bias``, ``total``."""
    layers = [layers] if isinstance(layers, nn.Module) else list(layers)
    out = dict.fromkeys(("codes", "scales", "scales_of_scales", "code_tables", "bias"), 0)
    seen: set = set()
    for i, layer in enumerate(layers):
        weight = layer.weight
        qs = getattr(weight, "quant_state", None)
        if qs is None or not isinstance(weight, torch.Tensor):
            raise TypeError(
                f"layers[{i}] = a {type(layer).__name__} with no quantized weight: expected a "
                "bitsandbytes Linear4bit moved to its device, which quantizes it"
            )
        out["codes"] += _storage_bytes(weight.data, seen)
        out["scales"] += _storage_bytes(qs.absmax, seen)
        out["code_tables"] += _storage_bytes(qs.code, seen)
        if qs.nested:
            out["scales_of_scales"] += _storage_bytes(qs.state2.absmax, seen)
            out["scales_of_scales"] += _storage_bytes(qs.offset, seen)
            out["code_tables"] += _storage_bytes(qs.state2.code, seen)
        bias = getattr(layer, "bias", None)
        if isinstance(bias, torch.Tensor):
            out["bias"] += _storage_bytes(bias, seen)
    out["total"] = sum(out.values())
    return out
