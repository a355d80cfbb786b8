"""Unit 06's measured runs (notebooks/06_activation_checkpointing.ipynb).

Each policy of ``course_lib.techniques.checkpointing`` is applied to a copy of the same tiny GPT
and measured three ways, each beside its formula from ``course_lib.measure.estimate``:

- bytes kept for backward when the forward ends (MemoryMeter, the root module's post_forward row)
  against ``estimate.checkpointed_activation_bytes_gpt``;
- the peak of activations + temporaries over forward and backward (MemoryMeter's peak breakdown)
  against "kept + the largest checkpoint rebuilt" (``activation_bytes_gpt`` per block);
- matmul FLOPs of the whole step, recomputation included (``torch.utils.flop_counter``), against
  ``estimate.gpt_step_matmul_flops``; and gradients against the unchanged model.

Times (``time_overhead``) are medians of interleaved runs: on a shared 2-core machine they are
noisy, so they are shown, never checked. ``scale_table`` takes the same policies to 7B and GPT-3
with the paper formulas.
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass
from typing import Any, Sequence

import pandas as pd
import torch

from course_lib import kit, validate
from course_lib.measure import estimate
from course_lib.measure.estimate.checkpointing import CheckpointPolicy
from course_lib.measure.memory import MemoryMeter
from course_lib.measure.timing import time_fn
from course_lib.models import GPT, GPTConfig
from course_lib.techniques import checkpointing as ck
from course_lib.units.u06_activation_checkpointing.run_scale import (  # noqa: F401 (re-exported)
    MODELS,
    scale_table,
    source_corrections,
    virtual_7b_table,
)

#: the model of the lecture: 4 blocks, small enough to measure every policy in seconds
CONFIG = GPTConfig.tiny(n_layer=4)

#: (label, policy, k, save_ops) measured in the lecture
Case = tuple[str, CheckpointPolicy, int, Sequence[str]]
CASES: tuple[Case, ...] = (
    ("none", "none", 1, ck.MATMUL_OPS),
    ("full", "full", 1, ck.MATMUL_OPS),
    ("every 2nd block", "every_k", 2, ck.MATMUL_OPS),
    ("selective: keep matmuls", "selective", 1, ck.MATMUL_OPS),
    ("selective: recompute attention", "selective", 1, ("mm", "addmm")),
    ("segments of 2", "segments", 2, ck.MATMUL_OPS),
)


@dataclass(frozen=True)
class PolicyRow:
    """One checkpointing policy on the lecture's GPT, measured beside predicted."""

    case: str
    policy: str
    k: int
    save_ops: str
    kept_predicted: int
    kept_measured: int
    kept_residual: int
    peak_measured: int
    flops_predicted: int
    flops_measured: int
    max_grad_error: float
    flops_ratio: float
    kept_vs_none: float


@dataclass(frozen=True)
class TimeRow:
    """Median time of one forward + backward under one policy (:func:`time_overhead`)."""

    case: str
    median_ms: float
    time_ratio: float


@dataclass(frozen=True)
class SegmentRow:
    """One segment length k of :func:`segment_sweep`: kept bytes and backward peak."""

    k: int
    checkpoints: int
    kept_predicted: int
    kept_measured: int
    peak_predicted: int
    peak_measured: int
    peak_residual: int


def make_model(config: GPTConfig | None = None, *, seed: int = 0) -> GPT:
    """The tiny GPT with fixed weights (same seed, same model for every policy)."""
    torch.manual_seed(seed)
    return GPT(config or CONFIG)


def make_batch(
    config: GPTConfig, batch: int, seq: int, *, seed: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random token ids and targets, (batch, seq) int64 each."""
    validate.count("batch", batch, minimum=1)
    validate.count("seq", seq, minimum=1, maximum=config.block_size)
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, config.vocab_size, (batch, seq), generator=g)
    return idx, torch.randint(0, config.vocab_size, (batch, seq), generator=g)


def kept_bytes(model: torch.nn.Module, idx: torch.Tensor) -> int:
    """Measured: activation bytes alive when the forward of ``model(idx)`` ends (logits held)."""
    with MemoryMeter(model) as meter:
        logits = model(idx)
    del logits
    tl = meter.timeline
    return int(tl[tl["event"] == "post_forward"].iloc[-1]["activations"])


def kept_and_flops(model: GPT, idx: torch.Tensor, targets: torch.Tensor) -> tuple[int, int]:
    """Measured on ``model``: the bytes :func:`kept_bytes` finds, then the matmul FLOPs of one
    forward + backward, recomputation included (``FlopCounterMode``); the gradients stay."""
    from torch.utils.flop_counter import FlopCounterMode

    kept = kept_bytes(model, idx)
    with FlopCounterMode(display=False) as flops:
        model.loss(idx, targets).backward()
    return kept, int(flops.get_total_flops())


def _grad(p: torch.Tensor) -> torch.Tensor:
    """``p.grad`` after a backward, which gives every parameter of the GPT one."""
    assert p.grad is not None, "backward gives every parameter a gradient"
    return p.grad


def measure_case(
    base: GPT,
    idx: torch.Tensor,
    targets: torch.Tensor,
    policy: str,
    *,
    k: int = 1,
    save_ops: Sequence[str] = ck.MATMUL_OPS,
    reference_grads: Sequence[torch.Tensor] | None = None,
) -> dict[str, Any]:
    """Apply one policy to a copy of ``base`` and measure kept bytes, peak, FLOPs and gradients."""
    model = ck.apply_checkpointing(copy.deepcopy(base), policy, k=k, save_ops=save_ops)
    kept, flops = kept_and_flops(model, idx, targets)
    grads = [_grad(p).detach().clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    with MemoryMeter(model) as meter:
        model.loss(idx, targets).backward()
    peak = meter.peak_breakdown["activations"] + meter.peak_breakdown["temporaries"]
    err = (
        max(float((g - r).abs().max()) for g, r in zip(grads, reference_grads))
        if reference_grads is not None
        else 0.0
    )
    return {
        "kept": kept,
        "peak": int(peak),
        "flops": flops,
        "grads": grads,
        "max_grad_error": err,
    }


def policy_table(
    config: GPTConfig | None = None,
    *,
    batch: int = 4,
    seq: int = 64,
    cases: Sequence[Case] = CASES,
) -> pd.DataFrame:
    """One row per policy: kept bytes, peak and FLOPs, measured beside predicted, and the
    largest gradient difference from the unchanged model."""
    cfg = config or CONFIG
    base = make_model(cfg)
    idx, targets = make_batch(cfg, batch, seq)
    ref = measure_case(base, idx, targets, "none")  # the unchanged model, measured
    kept_none = estimate.checkpointed_activation_bytes_gpt(cfg, batch, seq)
    rows = []
    for label, policy, k, ops in cases:
        m = measure_case(
            base, idx, targets, policy, k=k, save_ops=ops, reference_grads=ref["grads"]
        )
        pred = estimate.checkpointed_activation_bytes_gpt(
            cfg, batch, seq, policy=policy, k=k, save_ops=ops
        )
        flops = estimate.gpt_step_matmul_flops(cfg, batch, seq, policy=policy, k=k, save_ops=ops)
        rows.append(
            PolicyRow(
                label,
                policy,
                k,
                ",".join(ops) if policy == "selective" else "",
                pred,
                m["kept"],
                m["kept"] - pred,
                m["peak"],
                flops["total"],
                m["flops"],
                m["max_grad_error"],
                m["flops"] / ref["flops"],
                m["kept"] / kept_none,
            )
        )
    df = kit.frame(rows, PolicyRow)
    df.attrs.update(config=cfg, batch=batch, seq=seq)
    return df


def plain_block_bytes(config: GPTConfig, batch: int, seq: int) -> int:
    """Predicted bytes one un-checkpointed block keeps (fp32): the whole model minus the model
    with only block 0 checkpointed, plus what the checkpoint keeps (its input, B T C values)."""
    none = estimate.checkpointed_activation_bytes_gpt(config, batch, seq)
    one = estimate.checkpointed_activation_bytes_gpt(
        config, batch, seq, policy="every_k", k=config.n_layer
    )
    return none - one + 4 * batch * seq * config.n_embd


def time_overhead(
    config: GPTConfig | None = None,
    *,
    batch: int = 4,
    seq: int = 64,
    cases: Sequence[Case] = CASES,
    rounds: int = 5,
) -> pd.DataFrame:
    """Median time of one forward + backward per policy, and its ratio to ``none``.

    Policies run interleaved (one step of each, ``rounds`` times) so that a slow moment of a
    shared machine hits them all. Noisy on 2 shared cores: shown, not checked.
    """
    rounds = validate.count("rounds", rounds, minimum=1)
    cfg = config or CONFIG
    base = make_model(cfg)
    idx, targets = make_batch(cfg, batch, seq)
    models = [
        (label, ck.apply_checkpointing(copy.deepcopy(base), p, k=k, save_ops=ops))
        for label, p, k, ops in cases
    ]

    def step(m: GPT) -> None:
        m.loss(idx, targets).backward()
        m.zero_grad(set_to_none=True)

    times: dict[str, list[float]] = {label: [] for label, _ in models}
    for _ in range(rounds):
        for label, m in models:
            times[label].append(time_fn(functools.partial(step, m), warmup=1, repeat=1).median_s)
    med = {label: float(pd.Series(t).median()) for label, t in times.items()}
    ref = med.get("none", min(med.values()))
    return kit.frame([TimeRow(label, 1e3 * t, t / ref) for label, t in med.items()], TimeRow)


def segment_sweep(
    config: GPTConfig | None = None,
    *,
    batch: int = 8,
    seq: int = 64,
    ks: Sequence[int] | None = None,
) -> pd.DataFrame:
    """Chen et al.'s segments on our GPT: kept bytes and the backward peak for each segment length.

    predicted_peak = kept + k plain blocks (the segment being rebuilt). The residual is the
    gradients of activations (temporaries) minus what backward frees inside the segment."""
    cfg = config or GPTConfig.tiny(n_layer=8, n_embd=32, n_head=2)
    ks = validate.counts(
        "ks", ks if ks is not None else [k for k in (1, 2, 4, 8) if k <= cfg.n_layer]
    )
    base = make_model(cfg)
    idx, targets = make_batch(cfg, batch, seq)
    plain = plain_block_bytes(cfg, batch, seq)
    rows = []
    for k in ks:
        m = measure_case(base, idx, targets, "segments", k=k)
        pred_kept = estimate.checkpointed_activation_bytes_gpt(
            cfg, batch, seq, policy="segments", k=k
        )
        pred_peak = pred_kept + k * plain
        rows.append(
            SegmentRow(
                k,
                -(-cfg.n_layer // k),
                pred_kept,
                m["kept"],
                pred_peak,
                m["peak"],
                m["peak"] - pred_peak,
            )
        )
    df = kit.frame(rows, SegmentRow)
    df.attrs.update(config=cfg, batch=batch, seq=seq, plain_block_bytes=plain)
    return df


def policy_options(n_layer: int) -> list[tuple[CheckpointPolicy, int, tuple[str, ...]]]:
    """Every (policy, k, save_ops) worth comparing on a GPT of ``n_layer`` blocks: none, three
    selective choices, every_k for k = 1..n_layer and segments for k = 2..n_layer."""
    options: list[tuple[CheckpointPolicy, int, tuple[str, ...]]] = [("none", 1, ck.MATMUL_OPS)]
    options += [("selective", 1, ops) for ops in (ck.MATMUL_OPS, ("mm", "addmm"), ("bmm",))]
    options += [("every_k", k, ck.MATMUL_OPS) for k in range(1, n_layer + 1)]
    options += [("segments", k, ck.MATMUL_OPS) for k in range(2, n_layer + 1)]
    return options


def cheapest_fitting_policy(
    config: GPTConfig, batch: int, seq: int, budget: int
) -> dict[str, Any] | None:
    """The policy whose kept bytes fit ``budget`` with the fewest recomputed matmul FLOPs
    (ties: fewer bytes), from the exact formulas; None if nothing fits."""
    budget = validate.count("budget", budget, minimum=0)
    best = None
    for policy, k, ops in policy_options(config.n_layer):
        kept = estimate.checkpointed_activation_bytes_gpt(
            config, batch, seq, policy=policy, k=k, save_ops=ops
        )
        if kept > budget:
            continue
        rec = estimate.gpt_step_matmul_flops(config, batch, seq, policy=policy, k=k, save_ops=ops)[
            "recompute"
        ]
        key = (rec, kept)
        if best is None or key < best[0]:
            best = (
                key,
                {"policy": policy, "k": k, "save_ops": tuple(ops), "kept": kept, "recompute": rec},
            )
    return None if best is None else best[1]
