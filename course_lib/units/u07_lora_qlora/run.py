"""LoRA and QLoRA, measured (notebooks/07_lora_qlora.ipynb).

- :func:`count_table`: trainable parameters after ``add_lora``, counted on real models (Llama-2-7B
  built on the meta device: shapes without memory) beside ``estimate.lora_params``;
- :func:`memory_table`: one Adam step of the tiny GPT under full fine-tuning, LoRA and QLoRA:
  gradient and optimizer bytes from MemoryMeter, frozen-base bytes read from the tensors, each
  beside its prediction;
- :func:`pretrained_model` / :func:`finetune`: pre-train the tiny GPT on the permutation task,
  then fine-tune it on a *shifted* task (every target moved by ``SHIFT`` in the vocabulary) with
  each method; :func:`finetune_summary`: how much of full fine-tuning's loss drop each reaches;
- :func:`nf4_table`: NF4 bytes per parameter and quantization error, ours and bitsandbytes';
- :func:`scale_table`: full vs LoRA vs QLoRA model-state bytes at 7B, 65B and 175B from
  ``estimate.finetune_state_bytes``, parameter counts measured on meta-device models;
- :func:`peft_parity`: our LoRA against peft's on the same weights.

Plain data out; plots in ``course_lib.units.u07_lora_qlora.plots``.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Iterator, Sequence

import pandas as pd
import torch
from torch import nn

from course_lib import validate
from course_lib.data import permutation_batch
from course_lib.measure import estimate
from course_lib.models import GPT, GPTConfig, Llama, LlamaConfig, count_params
from course_lib.techniques.lora import add_lora, lora_modules, trainable_params

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
]

#: the linear layers of the tiny GPT's blocks (attention qkv and output, MLP in and out)
GPT_TARGETS = ("c_attn", "c_proj", "c_fc")
#: our Llama's names for q, k, v, o, gate, up, down (estimate.LLAMA_LINEARS)
LLAMA_TARGETS = {"q": "wq", "k": "wk", "v": "wv", "o": "wo", "gate": "w1", "up": "w3", "down": "w2"}
METHODS = ("full", "lora", "qlora")
#: the fine-tuning task: the pre-training task with every target moved by SHIFT token ids
SHIFT = 3


# --------------------------------------------------------------------------------------------
# trainable parameters
# --------------------------------------------------------------------------------------------
def _llama_on_meta(config: LlamaConfig) -> Llama:
    with torch.device("meta"):  # shapes only: a 65B model costs no memory
        return Llama(config)


def count_table(r: int = 8) -> pd.DataFrame:
    """LoRA's trainable parameters, counted after ``add_lora`` on real modules (``measured``:
    ``requires_grad`` elements) beside ``estimate.lora_params`` (``predicted``)."""
    r = validate.count("r", r, minimum=1)
    rows = []

    def row(what, model, targets, predicted):
        base = count_params(model)
        add_lora(model, r=r, alpha=2 * r, targets=targets)
        measured = trainable_params(model)
        rows.append(
            {
                "model": what,
                "targets": ", ".join(targets),
                "r": r,
                "base_params": base,
                "predicted": predicted,
                "measured": measured,
                "residual": measured - predicted,
                "percent_of_base": 100 * measured / base,
            }
        )

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
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------------------------
# the fine-tuning task
# --------------------------------------------------------------------------------------------
def shifted_batch(
    config: GPTConfig, batch: int, seq: int, *, shift: int, generator: torch.Generator
):
    """The permutation task (``course_lib.data.permutation_batch``) with every target moved by
    ``shift`` (mod vocab): same inputs, a new rule to learn. ``shift=0`` is pre-training."""
    idx, tgt = permutation_batch(config, batch, seq, generator=generator)
    return idx, (tgt + shift) % config.vocab_size


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    # the tiny GPT's matmuls are far too small to share between threads: on 2 cores (or a busy
    # machine) 2 threads made fine-tuning 5x slower than 1; restore the caller's setting after
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


def _train(
    model: nn.Module,
    *,
    steps: int,
    lr: float,
    shift: int,
    batch: int,
    seq: int,
    seed: int,
    label: str | None = None,
) -> list[dict]:
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=lr)
    gen = torch.Generator().manual_seed(seed)
    rows = []
    with _one_thread():
        for step in range(steps):
            idx, tgt = shifted_batch(model.config, batch, seq, shift=shift, generator=gen)
            loss = model.loss(idx, tgt)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            rows.append({"method": label, "step": step, "loss": float(loss.detach())})
    return rows


@functools.lru_cache(maxsize=4)
def _pretrained_state(config: GPTConfig, steps: int, seed: int) -> tuple[dict, float]:
    torch.manual_seed(seed)
    model = GPT(config)
    rows = _train(model, steps=steps, lr=1e-2, shift=0, batch=16, seq=16, seed=seed)
    return {k: v.clone() for k, v in model.state_dict().items()}, rows[-1]["loss"]


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
        got = _train(
            model,
            steps=steps,
            lr=lr or DEFAULT_LR[method],
            shift=SHIFT,
            batch=16,
            seq=16,
            seed=seed + 1,
            label=method,
        )
        k = trainable_params(model)
        rows += [{**row, "trainable": k} for row in got]
    return pd.DataFrame(rows)


def finetune_summary(df: pd.DataFrame, *, last: int = 10) -> pd.DataFrame:
    """Per method: first loss, final loss (mean of the ``last`` steps), the drop, and the drop as a
    percentage of full fine-tuning's (needs a ``full`` run in ``df``)."""
    out = df.groupby("method", sort=False).agg(
        trainable=("trainable", "first"),
        first_loss=("loss", "first"),
        final_loss=("loss", lambda s: float(s.tail(last).mean())),
    )
    out["drop"] = out["first_loss"] - out["final_loss"]
    if "full" in out.index:
        out["percent_of_full_drop"] = 100 * out["drop"] / out.loc["full", "drop"]
    return out


# --------------------------------------------------------------------------------------------
# memory of one step
# --------------------------------------------------------------------------------------------
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
    from course_lib.techniques.nf4 import quantized_bytes

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
        rows.append(
            {
                "method": method,
                "trainable": k,
                "grads": int(mem.end_breakdown["grads"]),
                "grads_pred": pred["grads"],
                "optimizer": int(mem.end_breakdown["optimizer"]),
                "optimizer_pred": pred["optimizer"],
                "target_weights": measured_w,
                "target_weights_pred": pred_w,
                "target_params": n_target,
                "bytes_per_target_param": measured_w / n_target,
            }
        )
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------------------------
# NF4: bytes and error
# --------------------------------------------------------------------------------------------
def nf4_table(
    shapes: Sequence[tuple[int, int]] = ((64, 192), (1024, 1024), (4096, 1024)), *, seed: int = 0
) -> pd.DataFrame:
    """For random normal weights of each ``(d_out, d_in)`` shape: bytes per parameter stored by
    ``bitsandbytes.nn.Linear4bit`` with and without double quantization (measured from its
    tensors; code tables left out) beside ``estimate.nf4_bytes``; the relative rms error of
    bitsandbytes' and of our quantizer (``techniques.nf4``)."""
    import bitsandbytes.functional as bf

    from course_lib.techniques.nf4 import dequantize_nf4, nf4_linear, quantize_nf4, quantized_bytes

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
            theirs = bf.dequantize_4bit(q.weight.data, q.weight.quant_state)
            rows.append(
                {
                    "shape": f"{d_out} x {d_in}",
                    "params": n,
                    "double_quant": dq,
                    "measured_bytes": measured,
                    "predicted_bytes": estimate.nf4_bytes(n, double_quant=dq)["total"],
                    "bytes_per_param": measured / n,
                    "scale_bits_per_param": 8 * (got["scales"] + got["scales_of_scales"]) / n,
                    "rel_rms_error_bnb": float(
                        ((theirs - w).pow(2).mean() / w.pow(2).mean()).sqrt()
                    ),
                    "rel_rms_error_ours": float(
                        ((ours - w).pow(2).mean() / w.pow(2).mean()).sqrt()
                    ),
                }
            )
    return pd.DataFrame(rows)


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


def scale_table() -> pd.DataFrame:
    """Model-state bytes (no activations) of full fine-tuning, LoRA and QLoRA for Llama 7B and 65B
    (parameter counts measured on meta-device models; adapters at r 8 on q, v and at QLoRA's
    setting, r 64 on all seven linears) and GPT-3 175B with the LoRA paper's r 4 on q, v
    (Hu et al. 2021; GPT-3: h 12288, 96 layers). bf16-mixed Adam (16 B per trained parameter)."""
    rows = []
    cases = []
    for name, cfg in llama_configs().items():
        n = count_params(_llama_on_meta(cfg))
        for r, targets in ((8, ("q", "v")), (64, "all")):
            k = estimate.transformer_lora_params(
                hidden=cfg.n_embd,
                ffn=cfg.ffn_hidden,
                layers=cfg.n_layer,
                r=r,
                targets=targets,
            )
            cases.append((f"Llama {name}", n, r, "q, v" if targets != "all" else "all seven", k))
    cases.append(
        (
            "GPT-3 175B",
            175_000_000_000,
            4,
            "q, v",
            estimate.transformer_lora_params(hidden=12288, ffn=4 * 12288, layers=96, r=4),
        )
    )
    for model, n, r, targets, k in cases:
        for method in METHODS:
            if method == "full" and any(
                row["model"] == model and row["method"] == "full" for row in rows
            ):
                continue
            b = estimate.finetune_state_bytes(n, method=method, lora_params=k)
            rows.append(
                {
                    "model": model,
                    "params": n,
                    "method": method,
                    "adapter": "" if method == "full" else f"r {r}, {targets}",
                    "trainable": n if method == "full" else k,
                    "frozen_base_GB": b["base"] / estimate.GB,
                    "trained_state_GB": (b["total"] - b["base"]) / estimate.GB,
                    "total_GB": b["total"] / estimate.GB,
                }
            )
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------------------------
# parity with peft
# --------------------------------------------------------------------------------------------
def peft_parity(*, r: int = 8, seed: int = 0) -> dict | None:
    """Our LoRA and ``peft``'s on the same pre-trained tiny GPT with the same (non-zero) adapter
    weights: max |difference| of the logits, before and after merging, and the trainable counts.
    None when peft is not installed."""
    try:
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
