"""Unit 07, memory of one fine-tuning step, NF4's bytes and error, and 7B-70B at scale.

Used by notebooks/07_lora_qlora.ipynb through :mod:`run` (which re-exports these names).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import pandas as pd
import torch
from torch import nn

from course_lib import kit
from course_lib.measure import estimate
from course_lib.models import GPTConfig, Llama, LlamaConfig, count_params
from course_lib.techniques.lora import lora_modules
from course_lib.units.u07_lora_qlora.run_finetune import (
    GPT_TARGETS,
    METHODS,
    SHIFT,
    make_finetune_model,
    pretrained_model,
    shifted_batch,
)


# --------------------------------------------------------------------------------------------
# trainable parameters
# --------------------------------------------------------------------------------------------
def _llama_on_meta(config: LlamaConfig) -> Llama:
    with torch.device("meta"):  # shapes only: a 65B model costs no memory
        return Llama(config)


# --------------------------------------------------------------------------------------------
# memory of one step
# --------------------------------------------------------------------------------------------
def _target_weight_bytes(model: nn.Module, method: str) -> tuple[int, int, int]:
    """(bytes of the targeted layers' frozen weights read from the tensors, their estimate, the
    number of target parameters): fp32, or NF4 codes + scales for qlora."""
    from course_lib.techniques.nf4 import quantized_bytes

    bases: list[Any]
    if method == "full":
        bases = [
            m
            for n, m in model.named_modules()
            if isinstance(m, nn.Linear) and n.rsplit(".", 1)[-1] in GPT_TARGETS
        ]
    else:
        bases = [m.base for m in lora_modules(model).values()]
    n_target = sum(b.in_features * b.out_features for b in bases)
    if method == "qlora":
        weights = quantized_bytes(bases)
        measured_w = weights["codes"] + weights["scales"] + weights["scales_of_scales"]
        pred_w = sum(estimate.nf4_bytes(b.in_features * b.out_features)["total"] for b in bases)
    else:
        measured_w = sum(b.weight.untyped_storage().nbytes() for b in bases)
        pred_w = 4 * n_target
    return measured_w, pred_w, n_target


@dataclass(frozen=True)
class MemoryRow:
    """One method of :func:`memory_table` (bytes at the end of one Adam step)."""

    method: str
    trainable: int
    grads: int
    grads_pred: int
    optimizer: int
    optimizer_pred: int
    target_weights: int
    target_weights_pred: int
    target_params: int
    bytes_per_target_param: float


def memory_table(
    *, r: int = 8, config: GPTConfig | None = None, batch: int = 8, seq: int = 16, seed: int = 0
) -> pd.DataFrame:
    """One Adam step of the tiny GPT per method, measured with MemoryMeter (fp32).

    Columns: ``trainable``; ``grads`` and ``optimizer`` measured (bytes at the end of the step)
    beside ``grads_pred`` and ``optimizer_pred`` (``estimate.model_state_bytes`` of the trainable
    parameters, with torch.optim's step counters); ``target_weights``: bytes of the targeted
    layers' frozen weights read from the tensors (fp32, or NF4 codes + scales from
    ``techniques.nf4.quantized_bytes``) beside ``target_weights_pred`` (4 B/param, or
    ``estimate.nf4_bytes`` per layer)."""
    from course_lib.measure.memory import MemoryMeter

    config = config or GPTConfig.tiny()
    rows = []
    for method in METHODS:
        model = make_finetune_model(method, r=r, config=config, seed=seed)
        params = [p for p in model.parameters() if p.requires_grad]
        opt = torch.optim.Adam(params, lr=1e-3)
        idx, tgt = shifted_batch(
            config, batch, seq, shift=SHIFT, generator=torch.Generator().manual_seed(seed)
        )
        with MemoryMeter(model, opt) as mem:
            model.loss(idx, tgt).backward()
            opt.step()
        k = sum(p.numel() for p in params)
        pred = estimate.model_state_bytes(
            k, precision="fp32", optimizer="adam", n_param_tensors=len(params)
        )
        measured_w, pred_w, n_target = _target_weight_bytes(model, method)
        rows.append(
            MemoryRow(
                method=method,
                trainable=k,
                grads=int(mem.end_breakdown["grads"]),
                grads_pred=pred["grads"],
                optimizer=int(mem.end_breakdown["optimizer"]),
                optimizer_pred=pred["optimizer"],
                target_weights=measured_w,
                target_weights_pred=pred_w,
                target_params=n_target,
                bytes_per_target_param=measured_w / n_target,
            )
        )
    return kit.frame(rows, MemoryRow)


# --------------------------------------------------------------------------------------------
# NF4: bytes and error
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class NF4Row:
    """One shape and double-quantization setting of :func:`nf4_table`."""

    shape: str
    params: int
    double_quant: bool
    measured_bytes: int
    predicted_bytes: float
    bytes_per_param: float
    scale_bits_per_param: float
    rel_rms_error_bnb: float
    rel_rms_error_ours: float


def _rel_rms(approx: torch.Tensor, w: torch.Tensor) -> float:
    return float(((approx - w).pow(2).mean() / w.pow(2).mean()).sqrt())


def nf4_table(
    shapes: Sequence[tuple[int, int]] = ((64, 192), (1024, 1024), (4096, 1024)), *, seed: int = 0
) -> pd.DataFrame:
    """For random normal weights of each ``(d_out, d_in)`` shape: bytes per parameter stored by
    ``bitsandbytes.nn.Linear4bit`` with and without double quantization (measured from its
    tensors; code tables left out) beside ``estimate.nf4_bytes``; the relative rms error of
    bitsandbytes' and of our quantizer (``techniques.nf4``)."""
    from course_lib.runtime.compat import import_optional
    from course_lib.techniques.nf4 import dequantize_nf4, nf4_linear, quantize_nf4, quantized_bytes

    bnb = import_optional("bitsandbytes", extra="lora", needed_for="the NF4 table")
    bf = import_optional("bitsandbytes.functional", extra="lora", needed_for="the NF4 table")

    rows = []
    gen = torch.Generator().manual_seed(seed)
    for d_out, d_in in shapes:
        lin = nn.Linear(d_in, d_out, bias=False)
        with torch.no_grad():
            lin.weight.copy_(torch.randn(d_out, d_in, generator=gen) * 0.02)
        w = lin.weight.detach()
        n = w.numel()
        ours = dequantize_nf4(*quantize_nf4(w), w.shape)
        for dq in (False, True):
            q = nf4_linear(lin, double_quant=dq)
            got = quantized_bytes(q)
            measured = got["codes"] + got["scales"] + got["scales_of_scales"]
            weight = q.weight
            assert isinstance(weight, bnb.nn.Params4bit), "nf4_linear holds a Params4bit"
            theirs = bf.dequantize_4bit(weight.data, weight.quant_state)
            rows.append(
                NF4Row(
                    shape=f"{d_out} x {d_in}",
                    params=n,
                    double_quant=dq,
                    measured_bytes=measured,
                    predicted_bytes=estimate.nf4_bytes(n, double_quant=dq)["total"],
                    bytes_per_param=measured / n,
                    scale_bits_per_param=8 * (got["scales"] + got["scales_of_scales"]) / n,
                    rel_rms_error_bnb=_rel_rms(theirs, w),
                    rel_rms_error_ours=_rel_rms(ours, w),
                )
            )
    return kit.frame(rows, NF4Row)


def model_nf4_loss(
    *, config: GPTConfig | None = None, batches: int = 4, seed: int = 0
) -> dict[str, float]:
    """The pre-trained tiny GPT's loss on its own task before and after its block linears are
    stored in NF4 (what QLoRA starts from), and on the shifted task."""
    from course_lib.techniques.nf4 import quantize_linears_

    out = {}
    for name, quantize in (("fp32", False), ("nf4", True)):
        model = pretrained_model(config=config, seed=seed)
        if quantize:
            quantize_linears_(model, GPT_TARGETS)
        for task, shift in (("pretraining task", 0), ("shifted task", SHIFT)):
            gen = torch.Generator().manual_seed(seed + 99)
            with torch.no_grad():
                losses = [
                    float(
                        model.loss(*shifted_batch(model.config, 16, 16, shift=shift, generator=gen))
                    )
                    for _ in range(batches)
                ]
            out[f"{name}, {task}"] = sum(losses) / len(losses)
    return out


# --------------------------------------------------------------------------------------------
# at scale
# --------------------------------------------------------------------------------------------
def llama_configs() -> dict[str, LlamaConfig]:
    """Llama-2-7B and LLaMA-65B shapes (Touvron et al. 2023): 65B is h 8192, 64 heads, 80 layers,
    SwiGLU 22016."""
    return {
        "7B": LlamaConfig.llama_7b_like(),
        "65B": LlamaConfig(n_embd=8192, n_head=64, n_layer=80, ffn_hidden=22016),
    }


#: LoRA adapters as (rank, targets): names of estimate.LLAMA_LINEARS or "all"
Adapters = tuple[tuple[int, tuple[str, ...] | str], ...]


@dataclass(frozen=True)
class ScaleRow:
    """One model and method of :func:`scale_table` (model state, GB)."""

    model: str
    params: int
    method: str
    adapter: str
    trainable: int
    frozen_base_GB: float
    trained_state_GB: float
    total_GB: float


def scale_table() -> pd.DataFrame:
    """Model-state bytes (no activations) of full fine-tuning, LoRA and QLoRA for Llama 7B and 65B
    (parameter counts measured on meta-device models; adapters at r 8 on q, v and at QLoRA's
    setting, r 64 on all seven linears) and GPT-3 175B with the LoRA paper's r 4 on q, v
    (Hu et al. 2021; GPT-3: h 12288, 96 layers). bf16-mixed Adam (16 B per trained parameter)."""
    both: Adapters = ((8, ("q", "v")), (64, "all"))  # Llama's adapters as (r, targets)
    models = [  # (model, parameters, hidden, ffn, layers, adapters)
        (f"Llama {name}", count_params(_llama_on_meta(c)), c.n_embd, c.ffn_hidden, c.n_layer, both)
        for name, c in llama_configs().items()
    ]
    models.append(("GPT-3 175B", 175_000_000_000, 12288, 4 * 12288, 96, ((4, ("q", "v")),)))
    rows = []
    for model, n, hidden, ffn, layers, adapters in models:
        for i, (r, targets) in enumerate(adapters):
            k = estimate.transformer_lora_params(
                hidden=hidden, ffn=ffn, layers=layers, r=r, targets=targets
            )
            adapter = f"r {r}, {'all seven' if targets == 'all' else 'q, v'}"
            for method in METHODS[1:] if i else METHODS:  # one full fine-tuning row per model
                b = estimate.finetune_state_bytes(n, method=method, lora_params=k)
                rows.append(
                    ScaleRow(
                        model=model,
                        params=n,
                        method=method,
                        adapter="" if method == "full" else adapter,
                        trainable=n if method == "full" else k,
                        frozen_base_GB=b["base"] / estimate.GB,
                        trained_state_GB=(b["total"] - b["base"]) / estimate.GB,
                        total_GB=b["total"] / estimate.GB,
                    )
                )
    return kit.frame(rows, ScaleRow)
