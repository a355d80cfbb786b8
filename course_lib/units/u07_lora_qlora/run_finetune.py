"""Unit 07, the fine-tuning task: a pretrained tiny GPT, a shifted task, and full / LoRA / QLoRA runs.

Used by notebooks/07_lora_qlora.ipynb through :mod:`run` (which re-exports these names).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Sequence

import pandas as pd
import torch

from course_lib import kit, validate
from course_lib.data import permutation_batch
from course_lib.measure.estimate.lora import FinetuneMethod
from course_lib.models import GPT, GPTConfig
from course_lib.techniques.lora import add_lora, trainable_params

#: the linear layers of the tiny GPT's blocks (attention qkv and output, MLP in and out)
GPT_TARGETS = ("c_attn", "c_proj", "c_fc")


#: our Llama's names for q, k, v, o, gate, up, down (estimate.LLAMA_LINEARS)
LLAMA_TARGETS = {"q": "wq", "k": "wk", "v": "wv", "o": "wo", "gate": "w1", "up": "w3", "down": "w2"}


METHODS: tuple[FinetuneMethod, ...] = ("full", "lora", "qlora")


#: the fine-tuning task: the pre-training task with every target moved by SHIFT token ids
SHIFT = 3


# --------------------------------------------------------------------------------------------
# the fine-tuning task
# --------------------------------------------------------------------------------------------
def shifted_batch(
    config: GPTConfig, batch: int, seq: int, *, shift: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """The permutation task (``course_lib.data.permutation_batch``) with every target moved by
    ``shift`` (mod vocab): same inputs, a new rule to learn. ``shift=0`` is pre-training."""
    idx, tgt = permutation_batch(config, batch, seq, generator=generator)
    return idx, (tgt + shift) % config.vocab_size


@dataclass(frozen=True)
class LossRow:
    """One training step of :func:`finetune`: its loss, and the parameters the method trains."""

    method: str | None
    step: int
    loss: float
    trainable: int


def _train(
    model: GPT, *, steps: int, lr: float, shift: int, seed: int, label: str | None = None
) -> list[LossRow]:
    """``steps`` Adam steps of ``model``'s trainable parameters, a fresh batch of 16 x 16 each."""
    params = [p for p in model.parameters() if p.requires_grad]
    k = trainable_params(model)
    opt = torch.optim.Adam(params, lr=lr)
    gen = torch.Generator().manual_seed(seed)
    rows = []
    # the tiny GPT's matmuls are far too small to share between threads: on 2 cores (or a busy
    # machine) 2 threads made fine-tuning 5x slower than 1
    with kit.one_thread():
        for step in range(steps):
            idx, tgt = shifted_batch(model.config, 16, 16, shift=shift, generator=gen)
            loss = model.loss(idx, tgt)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            rows.append(LossRow(label, step, float(loss.detach()), k))
    return rows


@functools.lru_cache(maxsize=4)
def _pretrained_state(
    config: GPTConfig, steps: int, seed: int
) -> tuple[dict[str, torch.Tensor], float]:
    torch.manual_seed(seed)
    model = GPT(config)
    rows = _train(model, steps=steps, lr=1e-2, shift=0, seed=seed)
    return {k: v.clone() for k, v in model.state_dict().items()}, rows[-1].loss


def pretrained_model(*, config: GPTConfig | None = None, steps: int = 200, seed: int = 0) -> GPT:
    """The tiny GPT pre-trained on the permutation task (Adam, lr 1e-2, batch 16, seq 16): loss
    from ln(65) = 4.17 to about 0.002. Computed once per (config, steps, seed) and cached;
    every call returns a fresh copy."""
    config = config or GPTConfig.tiny()
    state, _ = _pretrained_state(config, validate.count("steps", steps, minimum=1), seed)
    model = GPT(config)
    model.load_state_dict(state)
    return model


def make_finetune_model(
    method: str,
    *,
    r: int = 8,
    alpha: float | None = None,
    targets: Sequence[str] = GPT_TARGETS,
    config: GPTConfig | None = None,
    pretrain_steps: int = 200,
    seed: int = 0,
) -> GPT:
    """The pre-trained tiny GPT ready for ``method``: ``full`` (every parameter trainable),
    ``lora`` (adapters of rank ``r`` on ``targets``, the rest frozen), ``qlora`` (the targets'
    weights in NF4 with double quantization, then the same adapters). ``alpha`` defaults to 2r."""
    from course_lib.techniques.nf4 import quantize_linears_

    method = validate.choice("method", method, METHODS)
    model = pretrained_model(config=config, steps=pretrain_steps, seed=seed)
    if method == "full":
        return model
    torch.manual_seed(seed + 7)  # the adapters' A init
    if method == "qlora":
        quantize_linears_(model, targets)
    return add_lora(model, r=r, alpha=2 * r if alpha is None else alpha, targets=targets)


#: learning rates (Adam): the best of {3e-3, 1e-2, 3e-2} for 100 steps on the shifted task
DEFAULT_LR = {"full": 1e-2, "lora": 1e-2, "qlora": 1e-2}


def finetune(
    methods: Sequence[str] = METHODS,
    *,
    r: int = 8,
    steps: int = 80,
    targets: Sequence[str] = GPT_TARGETS,
    lr: float | None = None,
    config: GPTConfig | None = None,
    seed: int = 0,
) -> pd.DataFrame:
    """Fine-tune the pre-trained tiny GPT on the shifted task with each method (same batches):
    rows ``method``, ``step``, ``loss``, ``trainable`` (parameters trained)."""
    steps = validate.count("steps", steps, minimum=1)
    rows = []
    for method in validate.choices("methods", methods, METHODS):
        model = make_finetune_model(method, r=r, targets=targets, config=config, seed=seed)
        rate = lr or DEFAULT_LR[method]
        rows += _train(model, steps=steps, lr=rate, shift=SHIFT, seed=seed + 1, label=method)
    return kit.frame(rows, LossRow)


def finetune_summary(df: pd.DataFrame, *, last: int = 10) -> pd.DataFrame:
    """Per method: first loss, final loss (mean of the ``last`` steps), the drop, the drop as a
    percentage of full fine-tuning's and the final loss as a multiple of full fine-tuning's (needs
    a ``full`` run in ``df``). Show both: a method can reach nearly all of the drop and still end
    at many times full fine-tuning's loss when that loss is near zero."""
    out = df.groupby("method", sort=False).agg(
        trainable=("trainable", "first"),
        first_loss=("loss", "first"),
        final_loss=("loss", lambda s: float(s.tail(last).mean())),
    )
    out["drop"] = out["first_loss"] - out["final_loss"]
    if "full" in out.index:
        out["percent_of_full_drop"] = 100 * out["drop"] / out.loc["full", "drop"]
        out["final_loss_vs_full"] = out["final_loss"] / out.loc["full", "final_loss"]
    return out
