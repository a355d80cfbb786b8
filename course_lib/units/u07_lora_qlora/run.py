"""LoRA and QLoRA, measured (notebooks/07_lora_qlora.ipynb).

- :func:`count_table`: trainable parameters after ``add_lora``, counted on real models (Llama-2-7B
  built on the meta device: shapes without memory) beside ``estimate.lora_params``;
- :func:`memory_table`: one Adam step of the tiny GPT under full fine-tuning, LoRA and QLoRA:
  gradient and optimizer bytes from MemoryMeter, frozen-base bytes read from the tensors, each
  beside its prediction;
- :func:`pretrained_model` / :func:`finetune`: pre-train the tiny GPT on the permutation task,
  then fine-tune it on a *shifted* task (every target moved by ``SHIFT`` in the vocabulary) with
  each method; :func:`finetune_summary`: how much of full fine-tuning's loss drop each reaches
  and its final loss as a multiple of full fine-tuning's;
- :func:`nf4_table`: NF4 bytes per parameter and quantization error, ours and bitsandbytes';
- :func:`scale_table`: full vs LoRA vs QLoRA model-state bytes at 7B, 65B and 175B from
  ``estimate.finetune_state_bytes``, parameter counts measured on meta-device models;
- :func:`peft_parity`: our LoRA against peft's on the same weights;
- :func:`technique_summary`: every single-device technique of units 02-07 on the tiny GPT, peak
  memory and time per example measured against one fp32 Adam baseline (S0 §5.4.9's table).

Plain data out; plots in ``course_lib.units.u07_lora_qlora.plots``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd
import torch
from torch import nn

from course_lib import kit, validate
from course_lib.measure import estimate
from course_lib.models import GPT, GPTConfig, LlamaConfig, count_params
from course_lib.techniques.lora import add_lora, lora_modules, trainable_params
from course_lib.units.u07_lora_qlora.run_finetune import (
    GPT_TARGETS,
    LLAMA_TARGETS,
    METHODS,
    SHIFT,
    finetune,
    finetune_summary,
    make_finetune_model,
    pretrained_model,
    shifted_batch,
)
from course_lib.units.u07_lora_qlora.run_memory import (
    _llama_on_meta,
    llama_configs,
    memory_table,
    model_nf4_loss,
    nf4_table,
    scale_table,
)
from course_lib.units.u07_lora_qlora.run_summary import TECHNIQUES, technique_summary

__all__ = [
    "GPT_TARGETS",
    "LLAMA_TARGETS",
    "METHODS",
    "SHIFT",
    "count_table",
    "memory_table",
    "shifted_batch",
    "pretrained_model",
    "make_finetune_model",
    "finetune",
    "finetune_summary",
    "nf4_table",
    "model_nf4_loss",
    "llama_configs",
    "scale_table",
    "peft_parity",
    "TECHNIQUES",
    "technique_summary",
]


@dataclass(frozen=True)
class CountRow:
    """One model of :func:`count_table`: LoRA's trainable parameters, counted and predicted."""

    model: str
    targets: str
    r: int
    base_params: int
    predicted: int
    measured: int
    residual: int
    percent_of_base: float


def count_table(r: int = 8) -> pd.DataFrame:
    """LoRA's trainable parameters, counted after ``add_lora`` on real modules (``measured``:
    ``requires_grad`` elements) beside ``estimate.lora_params`` (``predicted``)."""
    r = validate.count("r", r, minimum=1)
    rows = []

    def row(what: str, model: nn.Module, targets: Sequence[str], predicted: int) -> None:
        base = count_params(model)
        add_lora(model, r=r, alpha=2 * r, targets=targets)
        measured = trainable_params(model)
        rows.append(
            CountRow(
                what, ", ".join(targets), r, base, predicted, measured, measured - predicted,
                100 * measured / base,
            )
        )  # fmt: skip

    with torch.device("meta"):
        one = nn.Sequential(nn.Linear(4096, 4096, bias=False))
    row("one 4096 x 4096 linear", one, ["0"], estimate.lora_params([(4096, 4096)], r=r))
    tiny = GPT(GPTConfig.tiny())
    shapes = [
        (m.in_features, m.out_features)
        for n, m in tiny.named_modules()
        if isinstance(m, nn.Linear) and n.rsplit(".", 1)[-1] in GPT_TARGETS
    ]
    row("tiny GPT (this unit)", tiny, list(GPT_TARGETS), estimate.lora_params(shapes, r=r))
    cfg = LlamaConfig.llama_7b_like()
    for targets in (("q", "v"), tuple(LLAMA_TARGETS)):
        pred = estimate.transformer_lora_params(
            hidden=cfg.n_embd, ffn=cfg.ffn_hidden, layers=cfg.n_layer, r=r, targets=targets
        )
        row(
            f"Llama-2-7B, {'q, v' if len(targets) == 2 else 'all seven linears'}",
            _llama_on_meta(cfg),
            [LLAMA_TARGETS[t] for t in targets],
            pred,
        )
    return kit.frame(rows, CountRow)


# --------------------------------------------------------------------------------------------
# parity with peft
# --------------------------------------------------------------------------------------------
def peft_parity(*, r: int = 8, seed: int = 0) -> dict[str, str | int | float] | None:
    """Our LoRA and ``peft``'s on the same pre-trained tiny GPT with the same (non-zero) adapter
    weights: max |difference| of the logits, before and after merging, and the trainable counts.
    None when peft is not installed."""
    from course_lib.runtime.compat import quiet_import_logs

    try:
        with quiet_import_logs():  # peft imports torchao when it is there
            import peft
    except ImportError:
        return None
    ours = make_finetune_model("lora", r=r, seed=seed)
    theirs = peft.get_peft_model(
        pretrained_model(seed=seed),
        peft.LoraConfig(r=r, lora_alpha=2 * r, target_modules=list(GPT_TARGETS)),
    )
    gen = torch.Generator().manual_seed(seed + 5)
    layers = lora_modules(ours)
    for layer in layers.values():  # a "trained" adapter: B no longer zero
        layer.lora_B.data = torch.randn(layer.lora_B.shape, generator=gen) * 0.05
    for name, mod in theirs.named_modules():
        if isinstance(getattr(mod, "lora_A", None), nn.ModuleDict):
            mine = layers[name.removeprefix("base_model.model.")]
            mod.lora_A["default"].weight.data.copy_(mine.lora_A)
            mod.lora_B["default"].weight.data.copy_(mine.lora_B)
    idx, _ = shifted_batch(ours.config, 4, 16, shift=0, generator=gen)
    counts = {
        "trainable_ours": trainable_params(ours),
        "trainable_peft": sum(p.numel() for p in theirs.parameters() if p.requires_grad),
    }
    with torch.no_grad():
        before = float((ours(idx) - theirs(idx)).abs().max())
        for layer in layers.values():
            layer.merge()
        after = float((ours(idx) - theirs.merge_and_unload()(idx)).abs().max())
    return {
        "peft_version": peft.__version__,
        "max_abs_diff": before,
        "max_abs_diff_merged": after,
        **counts,
    }
