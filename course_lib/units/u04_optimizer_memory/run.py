"""Optimizer memory, measured.

Introduced in notebooks/04_optimizer_memory.ipynb. Measured runs, each returning a pandas DataFrame:

- :func:`state_bytes_table`: the state each optimizer really allocates for the tiny GPT (read from
  ``optimizer.state`` and from MemoryMeter) beside ``estimate.model_state_bytes`` (and, for 8-bit
  Adam, ``estimate.adam8bit_state_bytes``);
- :func:`mixed_precision_accounting`: the classic recipe (bf16 model + fp32 master + Adam) measured
  per parameter: 16 bytes at rest, more during the step (the fp32 gradients);
- :func:`accounting_table`: the 12 / 16 / 18 / 20 bytes-per-parameter figures of the literature,
  each from its components (bytes from ``estimate.dtype_bytes``) and its source;
- :func:`convergence`: every optimizer on the same task, same seed, same batches.

Plain data out; plots in course_lib.units.u04_optimizer_memory.plots.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import pandas as pd
import torch

from course_lib import validate
from course_lib.data import permutation_batch
from course_lib.measure import estimate
from course_lib.models import GPT, GPTConfig, count_params
from course_lib.techniques import optim as O

__all__ = ["DEFAULT_LR", "state_bytes_table", "mixed_precision_accounting", "ACCOUNTINGS",
           "accounting_table", "convergence", "task_batch"]

#: learning rates for the tiny GPT on the task: the best of a small grid (3-4 values each, 30 steps,
#: batch 8, seq 16) -- SGD needs a far larger one than the adaptive methods
DEFAULT_LR: dict[str, float] = {"sgd": 0.2, "momentum": 0.1, "rmsprop": 1e-3, "adagrad": 1e-2,
                                "adam": 1e-2, "adamw": 1e-2, "adam8bit": 1e-2}


def task_batch(config: GPTConfig, batch: int, seq: int, *, generator: torch.Generator):
    """The learnable sequence task of unit 03: :func:`course_lib.data.permutation_batch` (a fixed
    random permutation of the vocabulary)."""
    return permutation_batch(config, batch, seq, generator=generator)


def _model(config: GPTConfig, seed: int) -> GPT:
    torch.manual_seed(seed)
    return GPT(config)


# --------------------------------------------------------------------------------------------
# state bytes per optimizer
# --------------------------------------------------------------------------------------------
def state_bytes_table(names: Sequence[str] = O.OPTIMIZERS, *, config: GPTConfig | None = None,
                      batch: int = 4, seq: int | None = None, seed: int = 0) -> pd.DataFrame:
    """Optimizer state of the tiny GPT after one step, per optimizer (``seq`` defaults to
    min(32, block_size): the state does not depend on it).

    Columns: ``n_params``; ``naive`` = ``estimate.model_state_bytes(...)["optimizer"]`` (bytes per
    parameter times n, plus torch.optim's 4-byte ``step`` counters: 2 bytes per parameter for
    8-bit Adam); ``predicted`` = ``naive`` for the torch.optim optimizers and
    ``estimate.adam8bit_state_bytes(...)["total"]`` for 8-bit Adam (bitsandbytes' exact rules:
    fp32 state for small tensors, per-block absmax, shared code books); ``measured`` =
    MemoryMeter's *optimizer* bytes at the end of a step; ``moments`` / ``step`` / ``quant_meta``
    from :func:`course_lib.techniques.optim.state_bytes`; ``bytes_per_param`` = measured /
    n_params; ``residual`` = measured - predicted.
    """
    from course_lib.measure.memory import MemoryMeter

    config = config or GPTConfig.tiny()
    seq = min(32, config.block_size) if seq is None else seq
    rows = []
    for name in validate.choices('names', names, O.OPTIMIZERS):
        model = _model(config, seed)
        opt = O.make_optimizer(name, model.parameters(), lr=DEFAULT_LR[name])
        idx, tgt = task_batch(config, batch, seq, generator=torch.Generator().manual_seed(seed))
        with MemoryMeter(model, opt) as mem:
            opt.zero_grad(set_to_none=True)
            model.loss(idx, tgt).backward()
            opt.step()
        n = count_params(model)
        with_grad = [p for p in model.parameters() if p.grad is not None]  # the ones with state
        naive = int(estimate.model_state_bytes(n, precision="fp32", optimizer=name,
                                               n_param_tensors=len(with_grad))["optimizer"])
        pred = (estimate.adam8bit_state_bytes(p.numel() for p in with_grad)["total"]
                if name == "adam8bit" else naive)
        sb = O.state_bytes(opt)
        measured = int(mem.end_breakdown["optimizer"])
        rows.append({"optimizer": name, "n_params": n, "naive": naive, "predicted": int(pred),
                     "measured": measured, "residual": measured - int(pred), **{k: sb[k] for k in ("moments", "step", "quant_meta")},
                     "state_total": sb["total"],
                     "bytes_per_param": measured / n,
                     "predicted_per_param": estimate.optimizer_state_bytes_per_param(name)})
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------------------------
# mixed-precision Adam, measured per parameter
# --------------------------------------------------------------------------------------------
def mixed_precision_accounting(*, config: GPTConfig | None = None, batch: int = 4, seq: int = 32,
                               seed: int = 0, dtype: torch.dtype = torch.bfloat16) -> pd.DataFrame:
    """The classic recipe (16-bit model, fp32 master weights, Adam on the master) measured with
    MemoryMeter around one optimizer step: rows ``at rest`` (after the step) and ``during step``
    (MemoryMeter's peak inside ``step()``), bytes per parameter by component, beside the
    ZeRO accounting of ``estimate.model_state_bytes(precision="bf16-mixed", optimizer="adam")``.
    """
    from course_lib.measure.memory import MemoryMeter

    config = config or GPTConfig.tiny()
    model = _model(config, seed).to(dtype)
    mw = O.MasterWeights(model, "adam", lr=1e-3)
    idx, tgt = task_batch(config, batch, seq, generator=torch.Generator().manual_seed(seed))
    for _ in range(2):  # the first step creates the Adam state
        mw.zero_grad()
        model.loss(idx, tgt).backward()
        if _ == 1:
            with MemoryMeter(model, mw.optimizer, track=mw.master) as mem:
                mw.step()
        else:
            mw.step()
    n = count_params(model)
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    pred = estimate.model_state_bytes(n, precision="bf16-mixed", optimizer="adam",
                                      n_param_tensors=len(mw.master))

    def row(label: str, bd: Mapping[str, int]) -> dict:
        return {"when": label,
                "params (16-bit)": (bd["params"] - buffers) / n,
                "grads (16-bit)": bd["grads"] / n,
                "master (fp32)": bd["other"] / n,
                "adam m, v (fp32)": bd["optimizer"] / n,
                "fp32 grads + scratch": (bd["activations"] + bd["temporaries"]) / n,
                "total": (sum(bd.values()) - buffers) / n}

    predicted = {"when": "predicted (ZeRO accounting)", "params (16-bit)": pred["params"] / n,
                 "grads (16-bit)": pred["grads"] / n, "master (fp32)": pred["master"] / n,
                 "adam m, v (fp32)": pred["optimizer"] / n, "fp32 grads + scratch": 0.0,
                 "total": pred["total"] / n}
    return pd.DataFrame([predicted, row("measured at rest", mem.end_breakdown),
                         row("measured peak during step", mem.peak_breakdown)]).set_index("when")


# --------------------------------------------------------------------------------------------
# 12, 16, 18 or 20 bytes per parameter? One table, with sources
# --------------------------------------------------------------------------------------------
#: (source, what it counts, components as (component, dtype) pairs, where in the source)
ACCOUNTINGS: tuple[tuple[str, str, tuple[tuple[str, str], ...], str], ...] = (
    ("ZeRO, K only", "optimizer states of mixed-precision Adam (K = 12)",
     (("fp32 master", "fp32"), ("Adam m", "fp32"), ("Adam v", "fp32")),
     "Rajbhandari et al. 2019, arXiv:1910.02054, Sec. 3.1; EleutherAI 'Transformer Math 101' (2023), optimizer states"),
    ("fp32 Adam, no grads", "fp32 weights + Adam moments, gradients left out",
     (("fp32 weights", "fp32"), ("Adam m", "fp32"), ("Adam v", "fp32")),
     "a common shortcut: 'Adam needs 3x the weights'"),
    ("Ultra-Scale Playbook, params+grads", "bf16 params and grads plus fp32 copies of both, before optimizer states",
     (("bf16 params", "bf16"), ("bf16 grads", "bf16"), ("fp32 master", "fp32"), ("fp32 grads", "fp32")),
     "Tazi et al. 2025, The Ultra-Scale Playbook (Hugging Face), 'Memory usage in Transformers'"),
    ("ZeRO, mixed-precision Adam", "2 + 2 + K with K = 12",
     (("fp16 params", "fp16"), ("fp16 grads", "fp16"), ("fp32 master", "fp32"), ("Adam m", "fp32"), ("Adam v", "fp32")),
     "Rajbhandari et al. 2019, arXiv:1910.02054, Sec. 3.1; Micikevicius et al. 2017, arXiv:1710.03740"),
    ("fp32 Adam", "fp32 weights, fp32 grads, Adam moments",
     (("fp32 weights", "fp32"), ("fp32 grads", "fp32"), ("Adam m", "fp32"), ("Adam v", "fp32")),
     "Kingma & Ba 2014, arXiv:1412.6980 (state), torch.optim.Adam"),
    ("HF Transformers docs", "mixed precision: fp16 + fp32 weights (6), fp32 grads (4), AdamW (8)",
     (("fp16 weights", "fp16"), ("fp32 weights", "fp32"), ("fp32 grads", "fp32"), ("Adam m", "fp32"), ("Adam v", "fp32")),
     "Hugging Face Transformers docs, 'Model training anatomy' / 'GPU memory usage': 18 bytes/param"),
    ("Ultra-Scale Playbook, fp32 grad accumulation", "16 plus fp32 gradients kept for accumulation",
     (("bf16 params", "bf16"), ("bf16 grads", "bf16"), ("fp32 master", "fp32"), ("Adam m", "fp32"),
      ("Adam v", "fp32"), ("fp32 grads", "fp32")),
     "Tazi et al. 2025, The Ultra-Scale Playbook: 'some libraries store grads in fp32' (+4N)"),
    ("8-bit Adam, mixed precision", "bf16 params and grads, fp32 master, 8-bit m and v",
     (("bf16 params", "bf16"), ("bf16 grads", "bf16"), ("fp32 master", "fp32"), ("Adam m", "uint8"), ("Adam v", "uint8")),
     "Dettmers et al. 2021, arXiv:2110.02861; EleutherAI 'Transformer Math 101' (8-bit optimizers: 6 bytes of state)"),
)


def accounting_table() -> pd.DataFrame:
    """The bytes-per-parameter figures of the literature, each computed from its components with
    ``estimate.dtype_bytes`` (nothing typed in by hand): source, what it counts, the components,
    bytes per parameter, and the reference."""
    rows = []
    for source, counts, parts, ref in ACCOUNTINGS:
        rows.append({"source": source, "counts": counts,
                     "components": " + ".join(f"{name} {estimate.dtype_bytes(dt)}" for name, dt in parts),
                     "bytes_per_param": sum(estimate.dtype_bytes(dt) for _, dt in parts),
                     "reference": ref})
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------------------------
# convergence
# --------------------------------------------------------------------------------------------
def convergence(names: Sequence[str] = O.OPTIMIZERS, *, steps: int = 40, config: GPTConfig | None = None,
                batch: int = 8, seq: int = 16, seed: int = 0,
                lr: Mapping[str, float] | None = None) -> pd.DataFrame:
    """Train the tiny GPT on the task with each optimizer: same initial weights (seed), same
    batches. Rows: optimizer, lr, step, loss. ``lr`` overrides :data:`DEFAULT_LR` per name."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps={steps!r} must be an int >= 1")
    config = config or GPTConfig.tiny()
    lrs = {**DEFAULT_LR, **(lr or {})}
    rows = []
    for name in validate.choices('names', names, O.OPTIMIZERS):
        model = _model(config, seed)
        opt = O.make_optimizer(name, model.parameters(), lr=lrs[name])
        gen = torch.Generator().manual_seed(seed + 1)
        for step in range(steps):
            idx, tgt = task_batch(config, batch, seq, generator=gen)
            opt.zero_grad(set_to_none=True)
            loss = model.loss(idx, tgt)
            loss.backward()
            opt.step()
            rows.append({"optimizer": name, "lr": lrs[name], "step": step, "loss": float(loss.detach())})
    return pd.DataFrame(rows)
