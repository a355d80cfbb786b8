"""Unit 02, second half: the roofline's prediction of throughput, the MFU of a GPT step, and the
batch size as an optimization question (the learning rate against the batch).

Introduced in notebooks/02_batch_size_and_accumulation.ipynb; re-exported by ``run.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pandas as pd
import torch
import torch.nn.functional as F

from course_lib import kit, validate
from course_lib.measure import estimate
from course_lib.models import GPT, MLP, GPTConfig, MLPConfig, count_params
from course_lib.runtime.device import default_device
from course_lib.units.u02_batch_size_and_accumulation.run_roofline import time_op


@dataclass(frozen=True)
class PredictionRow:
    """Samples/s at one batch: the roofline's prediction beside the measurement."""

    batch: int
    intensity: float
    predicted_samples_per_s: float
    measured_samples_per_s: float
    ratio: float = field(metadata=kit.column("measured / predicted"))


@dataclass(frozen=True)
class EvalRow:
    """The held-out loss of one run of :func:`lr_scaling_runs` after ``samples`` samples."""

    run: str
    samples: int
    step: int
    eval_loss: float


# --------------------------------------------------------------------------------------------
# throughput predicted from the roofline
# --------------------------------------------------------------------------------------------
def roofline_step_time(model: MLP, batch: int, peak_flops: float, bandwidth: float) -> dict:
    """Lower bound on one SGD step of an MLP from the roofline: each Linear is three matmuls
    (forward, gradient of the input, gradient of the weight; the first layer skips the input
    gradient), each activation a read and a write forward and backward, and SGD reads the
    parameter and its gradient and writes the parameter (12 bytes per fp32 parameter). Each
    operation costs max(FLOP / peak, bytes / bandwidth); the step is their sum (fp32)."""
    if not isinstance(model, MLP):
        raise TypeError(f"model must be a course_lib.models.MLP, got {type(model).__name__}")
    B = validate.count("batch", batch, minimum=1)
    widths = model.config.widths
    ops: list[tuple[int, int]] = []  # (FLOP, bytes) of each operation, in the step's order
    flops = 0  # the matmuls' FLOP: the model FLOP of the step
    for i, (d_in, d_out) in enumerate(zip(widths, widths[1:])):
        # forward (B x d_in @ d_in x d_out), weight grad
        shapes = [(B, d_out, d_in), (d_in, d_out, B)]
        if i > 0:
            shapes.append((B, d_in, d_out))  # gradient of the layer's input
        matmuls = [(estimate.matmul_flops(*s), estimate.matmul_bytes(*s)) for s in shapes]
        flops += sum(f for f, _ in matmuls)
        ops += matmuls
        if i < len(widths) - 2:  # the activation: forward and backward, one read and one write each
            ops.append((2 * B * d_out, 2 * 2 * 4 * B * d_out))
    n_params = count_params(model)
    ops.append((2 * n_params, 12 * n_params))  # SGD
    return {
        "batch": B,
        "flops": flops,
        "bytes": sum(b for _, b in ops),
        "predicted_s": sum(estimate.roofline_time(f, b, peak_flops, bandwidth) for f, b in ops),
    }


def throughput_prediction(model: MLP, measured: pd.DataFrame, machine: dict) -> pd.DataFrame:
    """Predicted (roofline) beside measured samples/s, one row per batch of ``measured`` (the
    table of ``throughput_vs_batch``); ``machine`` is the roofline that ``roofline_ops``
    measured (its peak FLOP/s and bandwidth)."""
    rows = []
    for _, r in measured.iterrows():
        p = roofline_step_time(
            model, int(r["batch"]), machine["peak_flop_per_s"], machine["bandwidth_bytes_per_s"]
        )
        predicted, got = r["batch"] / p["predicted_s"], float(r["samples_per_s"])
        rows.append(
            PredictionRow(int(r["batch"]), p["flops"] / p["bytes"], predicted, got, got / predicted)
        )
    return kit.frame(rows, PredictionRow)


# --------------------------------------------------------------------------------------------
# MFU of a GPT training step
# --------------------------------------------------------------------------------------------
def gpt_step_mfu(
    config: GPTConfig,
    batch: int,
    peak_flops: float,
    *,
    device=None,
    warmup: int = 2,
    repeat: int = 5,
) -> dict:
    """Time one AdamW training step of ``GPT(config)`` on ``batch`` sequences of
    ``config.block_size`` tokens; count its model FLOPs (6N + 12 L T C per token, PaLM's
    convention) and divide the achieved FLOP/s by ``peak_flops`` (measured by the caller)."""
    device = torch.device(device) if device is not None else default_device()
    B, T = validate.count("batch", batch, minimum=1), config.block_size
    torch.manual_seed(0)
    model = GPT(config).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    idx = torch.randint(0, config.vocab_size, (B, T), device=device)

    def step():
        model.loss(idx, idx).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    median_s = time_op(step, device, warmup, repeat)
    n = count_params(model)
    per_token = estimate.training_flops_per_token(
        n, layers=config.n_layer, hidden=config.n_embd, seq=T
    )
    flops = per_token * B * T
    return {
        "params": n,
        "tokens": B * T,
        "flops_per_step": flops,
        "median_s": median_s,
        "achieved_flop_per_s": flops / median_s,
        "peak_flop_per_s": peak_flops,
        "mfu": estimate.mfu(flops, median_s, peak_flops),
        "six_n_share": 6 * n / per_token,
    }


# --------------------------------------------------------------------------------------------
# the learning rate against the batch (Goyal et al. 2017), and the gradient noise scale
# --------------------------------------------------------------------------------------------
def teacher_task(n: int = 4096, *, in_features: int = 16, classes: int = 4, seed: int = 0):
    """A classification task made in code: labels from a random 'teacher' MLP's argmax."""
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    teacher = MLP(MLPConfig(in_features=in_features, hidden=(32,), out_features=classes))
    x = torch.randn(n, in_features, generator=g)
    with torch.no_grad():
        y = teacher(x).argmax(dim=1)
    return x, y


def _student(in_features: int, classes: int) -> MLP:
    torch.manual_seed(1)  # every run starts from the same weights
    return MLP(MLPConfig(in_features=in_features, hidden=(64,), out_features=classes))


def lr_scaling_runs(
    runs: Sequence[dict], *, samples: int = 4096, eval_every: int = 256, seed: int = 0
) -> pd.DataFrame:
    """Train the same small MLP with plain SGD under several (batch, lr, warm-up) settings for
    the same number of samples; record the loss on a held-out set every ``eval_every`` samples.

    Each run is a dict: ``name``, ``batch``, ``lr`` and optionally ``warmup_steps`` (linear
    warm-up, ``estimate.warmup_lr``). Returns one row per (run, samples seen)."""
    x, y = teacher_task(samples + 1024, seed=seed)
    x_eval, y_eval = x[samples:], y[samples:]
    x, y = x[:samples], y[:samples]
    rows = []
    for run in runs:
        B = validate.count("batch", run["batch"], minimum=1)
        lr = validate.number("lr", run["lr"], positive=True)
        warm = validate.count("warmup_steps", run.get("warmup_steps", 0))
        model = _student(x.shape[1], int(y.max()) + 1)
        opt = torch.optim.SGD(model.parameters(), lr=lr)
        seen, step = 0, 0
        with torch.no_grad():
            rows.append(EvalRow(run["name"], 0, 0, float(F.cross_entropy(model(x_eval), y_eval))))
        while seen + B <= samples:
            for group in opt.param_groups:
                group["lr"] = estimate.warmup_lr(step, lr, warmup_steps=warm)
            loss = F.cross_entropy(model(x[seen : seen + B]), y[seen : seen + B])
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            seen, step = seen + B, step + 1
            if seen % eval_every == 0:
                with torch.no_grad():
                    loss = F.cross_entropy(model(x_eval), y_eval)
                    rows.append(EvalRow(run["name"], seen, step, float(loss)))
    return kit.frame(rows, EvalRow)


def simple_noise_scale_of(n_examples: int = 512, *, seed: int = 0) -> dict:
    """Measure McCandlish et al.'s simple noise scale B_simple = tr(Sigma) / |G|^2 of the
    student MLP at its initial weights on :func:`teacher_task`, from per-example gradients
    (``torch.func.vmap`` over ``torch.func.grad``): G is their mean, tr(Sigma) the sum over
    parameters of their variance."""
    x, y = teacher_task(n_examples, seed=seed)
    model = _student(x.shape[1], int(y.max()) + 1)
    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss_one(p, xi, yi):
        out = torch.func.functional_call(model, p, (xi.unsqueeze(0),))
        return F.cross_entropy(out, yi.unsqueeze(0))

    grads = torch.func.vmap(torch.func.grad(loss_one), in_dims=(None, 0, 0))(params, x, y)
    flat = torch.cat([g.reshape(n_examples, -1) for g in grads.values()], dim=1)  # (n, P)
    mean = flat.mean(0)
    trace = float(flat.var(0, unbiased=True).sum())
    g2 = float(mean.pow(2).sum())
    return {
        "examples": n_examples,
        "trace_cov": trace,
        "grad_sq_norm": g2,
        "b_simple": estimate.simple_noise_scale(trace, g2),
    }
