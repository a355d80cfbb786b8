"""Batch size and gradient accumulation, measured.

Introduced in notebooks/02_batch_size_and_accumulation.ipynb. Four measured runs:

- the roofline of this machine: matmul throughput (FLOP/s) and copy bandwidth (B/s), and a few
  training operations placed on it (matmuls of several sizes, GELU, LayerNorm);
- throughput (samples/s) and activation memory of one training step against batch size;
- the largest batch that fits a memory budget (simulated on CPU, the real device on a GPU);
- gradient accumulation: same gradient as the full batch, flat memory, time per effective batch.

Every function returns plain data (dicts, pandas DataFrames); plots live in course_lib.viz.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pandas as pd
import torch
from torch import nn

from course_lib import kit, validate
from course_lib.measure import estimate
from course_lib.measure.budget import MemoryBudget, SimulatedOOM
from course_lib.measure.memory import MemoryMeter
from course_lib.models import MLP
from course_lib.runtime.device import default_device
from course_lib.techniques.accumulation import (  # noqa: F401 (effective_batch: re-exported)
    accumulation_step,
    effective_batch,
    split_batch,
    training_step,
)
from course_lib.techniques.optim import make_optimizer
from course_lib.units.u02_batch_size_and_accumulation.run_roofline import (  # noqa: F401 (re-exported)
    OpCost,
    elementwise_op_cost,
    matmul_op_cost,
    measure_copy_bandwidth,
    measure_matmul_throughput,
    roofline_ops,
    time_op,
)
from course_lib.units.u02_batch_size_and_accumulation.run_scale import (  # noqa: F401 - re-exported
    gpt_step_mfu,
    lr_scaling_runs,
    roofline_step_time,
    simple_noise_scale_of,
    teacher_task,
    throughput_prediction,
)


@dataclass(frozen=True)
class ThroughputRow:
    """One batch size of :func:`throughput_vs_batch`."""

    batch: int
    median_s: float
    samples_per_s: float
    activation_bytes: int
    predicted_activation_bytes: int
    peak_bytes: int


@dataclass(frozen=True)
class ProbeRow:
    """One probe of :func:`largest_batch_that_fits`."""

    batch: int
    peak_bytes: int
    fits: bool


@dataclass(frozen=True)
class GradDiffRow:
    """Accumulated vs full-batch gradients, one dtype and micro-batch count."""

    dtype: str
    micro_batches: int
    micro_batch: int
    max_abs_diff: float
    rel_diff: float
    eps: float


@dataclass(frozen=True)
class AccumulationRow:
    """One optimizer step on an effective batch, accumulated or as one full batch."""

    accumulation_steps: int
    effective_batch: int
    mode: str
    micro_batch: int
    peak_bytes: int
    data_bytes: int
    activation_bytes: int
    median_s: float
    samples_per_s: float


# --------------------------------------------------------------------------------------------
# One training step; throughput and memory against batch size
# --------------------------------------------------------------------------------------------
def _mlp_batch(model: nn.Module, batch: int, *, device, generator_seed: int = 0):
    """Random inputs and class targets shaped for an MLP (first/last Linear give the widths)."""
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    if not linears:
        raise TypeError(f"model must contain nn.Linear layers, got {type(model).__name__}")
    g = torch.Generator().manual_seed(generator_seed)
    x = torch.randn(batch, linears[0].in_features, generator=g).to(device)
    y = torch.randint(0, linears[-1].out_features, (batch,), generator=g).to(device)
    return x, y


def step_peak_bytes(model: nn.Module, batch: int, *, optimizer: str = "adam", device=None) -> dict:
    """Measured bytes of one training step at `batch` (MemoryMeter): peak and its breakdown.

    The input batch is counted (as 'other'): it sits in device memory during the step too.
    'activations' is the activation bytes when the forward ends (what the formula predicts).
    Runs on a copy of `model`, so the caller's weights are untouched.
    """
    device = torch.device(device) if device is not None else default_device()
    if device.type == "cuda":
        # hand back blocks cached by earlier runs, so the reserved peak is this step's own
        torch.cuda.empty_cache()
    model = copy.deepcopy(model).to(device)
    opt = make_optimizer(optimizer, model.parameters(), lr=1e-2)
    x, y = _mlp_batch(model, batch, device=device)
    with MemoryMeter(model, opt, track=(x, y)) as meter:
        training_step(model, opt, nn.functional.cross_entropy, x, y)
    tl = meter.timeline
    out = {"batch": batch, "peak_bytes": int(meter.peak_bytes), "peak_phase": meter.peak_phase}
    out.update({f"peak_{k}": int(v) for k, v in meter.peak_breakdown.items()})
    out["activations"] = int(tl[tl["event"] == "post_forward"].iloc[-1]["activations"])
    if meter.cuda_peak_reserved is not None:
        out["cuda_peak_reserved"] = int(meter.cuda_peak_reserved)
    return out


def throughput_vs_batch(
    model: nn.Module,
    batch_sizes: Sequence[int],
    *,
    optimizer: str = "sgd",
    device=None,
    warmup: int = 3,
    repeat: int = 7,
) -> pd.DataFrame:
    """Samples/s of a training step and measured activation bytes, one row per batch size.

    `predicted_activation_bytes` comes from estimate.activation_bytes_mlp for the same widths.
    """
    device = torch.device(device) if device is not None else default_device()
    validate.counts("batch_sizes", batch_sizes)
    if not isinstance(model, MLP):
        raise TypeError(f"model must be a course_lib.models.MLP, got {type(model).__name__}")
    widths = model.config.widths
    activation: estimate.MlpActivation = validate.choice(
        "activation", model.config.activation, estimate.MLP_ACTIVATION_SAVES
    )
    rows = []
    for batch in batch_sizes:
        work = copy.deepcopy(model).to(device)
        opt = make_optimizer(optimizer, work.parameters(), lr=1e-2)
        x, y = _mlp_batch(work, batch, device=device)
        step = functools.partial(training_step, work, opt, nn.functional.cross_entropy, x, y)
        median_s = time_op(step, device, warmup, repeat)
        mem = step_peak_bytes(model, batch, optimizer=optimizer, device=device)
        acts, peak = mem["activations"], mem["peak_bytes"]
        predicted = int(estimate.activation_bytes_mlp(batch, widths, activation=activation))
        rows.append(ThroughputRow(batch, median_s, batch / median_s, acts, predicted, peak))
    return kit.frame(rows, ThroughputRow)


def largest_batch_that_fits(
    model: nn.Module,
    budget: MemoryBudget,
    *,
    optimizer: str = "sgd",
    device=None,
    multiple_of: int = 8,
    max_batch: int = 2**16,
) -> dict:
    """Largest batch (a multiple of `multiple_of`) whose *measured* step peak fits `budget`.

    Doubling, then bisection; each probe runs one real training step under MemoryMeter (input
    batch included). On a GPU with a real budget, the allocator's reserved peak is compared too,
    and a real torch.OutOfMemoryError counts as "does not fit". Returns the batch, its peak, the
    SimulatedOOM of the first batch that did not fit, and every probe (a DataFrame).
    """
    device = torch.device(device) if device is not None else default_device()
    multiple_of = validate.count("multiple_of", multiple_of, minimum=1)
    probes: list[ProbeRow] = []

    def fits(units: int) -> bool:
        batch = units * multiple_of
        try:
            m = step_peak_bytes(model, batch, optimizer=optimizer, device=device)
            p = m["peak_bytes"]
            if not budget.simulated:  # the device's own memory: what the allocator reserved counts
                p = max(p, m.get("cuda_peak_reserved", 0))
        except torch.OutOfMemoryError:  # the real device ran out before the budget said so
            torch.cuda.empty_cache()
            p = budget.capacity_bytes + 1
        probes.append(ProbeRow(batch, p, budget.fits(p)))
        return budget.fits(p)

    max_units = max_batch // multiple_of
    units, bad_units = _largest_true(fits, max_units)
    oom = None
    if bad_units is not None:
        bad = bad_units * multiple_of
        oom = SimulatedOOM(
            _peak_of(probes, bad),
            budget.capacity_bytes,
            what=f"a training step at batch {bad}",
            simulated=budget.simulated,
        )
    batch = units * multiple_of
    return {
        "batch": batch,
        "peak_bytes": _peak_of(probes, batch) if units else None,
        "oom": oom,
        "probes": kit.frame(probes, ProbeRow),
    }


def _largest_true(fits: Callable[[int], bool], max_units: int) -> tuple[int, int | None]:
    """(largest n in 1..max_units with fits(n), the smallest n that did not fit or None), for a
    monotone ``fits``: doubling, then bisection; (0, 1) when even 1 does not fit."""
    if not fits(1):
        return 0, 1
    lo, hi = 1, 2
    while hi <= max_units and fits(hi):
        lo, hi = hi, hi * 2
    if hi > max_units:
        return lo, None
    while hi - lo > 1:  # invariant: lo fits, hi does not
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo, hi


def _peak_of(probes: list[ProbeRow], batch: int) -> int:
    return next(p.peak_bytes for p in probes if p.batch == batch)


# --------------------------------------------------------------------------------------------
# Gradient accumulation
# --------------------------------------------------------------------------------------------
def accumulation_vs_full_batch(
    model: nn.Module,
    batch: int,
    micro_batch_counts: Sequence[int],
    *,
    dtypes: Sequence[torch.dtype] = (torch.float32, torch.float64),
    seed: int = 0,
) -> pd.DataFrame:
    """Max |difference| between accumulated and full-batch gradients, per dtype and count.

    The two are equal in exact arithmetic; in floating point the sums run in a different order,
    so they differ by rounding: about the dtype's machine epsilon times the gradient's size.
    `rel_diff` divides by the largest gradient entry; `eps` is torch.finfo(dtype).eps.
    """
    validate.counts("micro_batch_counts", micro_batch_counts)
    rows = []
    for dtype in dtypes:
        base = copy.deepcopy(model).to(dtype)
        x, y = _mlp_batch(base, batch, device="cpu", generator_seed=seed)
        x = x.to(dtype)
        full = _grads(base, nn.functional.cross_entropy, x, y, 1)
        scale = max(g.abs().max().item() for g in full)
        for k in micro_batch_counts:
            acc = _grads(base, nn.functional.cross_entropy, x, y, k)
            diff = max((a - f).abs().max().item() for a, f in zip(acc, full))
            name, eps = str(dtype).replace("torch.", ""), torch.finfo(dtype).eps
            rows.append(GradDiffRow(name, k, batch // k, diff, diff / scale, eps))
    return kit.frame(rows, GradDiffRow)


def _grads(model, loss_fn, x, y, micro_batches: int) -> list[torch.Tensor]:
    """Gradients after one accumulated backward (no optimizer step) on a copy of model."""
    work = copy.deepcopy(model)
    for xb, yb in split_batch(x, y, micro_batches):
        (loss_fn(work(xb), yb) / micro_batches).backward()
    return [p.grad.detach().clone() for p in work.parameters()]


def accumulation_memory_and_time(
    model: nn.Module,
    micro_batch: int,
    accumulation_steps: Sequence[int],
    *,
    optimizer: str = "sgd",
    device=None,
    warmup: int = 1,
    repeat: int = 3,
) -> pd.DataFrame:
    """For each number of accumulation steps k: the peak memory and time of one optimizer step on
    an effective batch of micro_batch * k, done (a) as k accumulated micro-batches and (b) as one
    full batch. Accumulation keeps the peak flat; the full batch's activations grow with k.

    The input batch is tracked as data ('data_bytes', MemoryMeter's 'other'): here the whole
    effective batch is in memory for both modes, while a real loader would bring in one
    micro-batch at a time. 'peak_bytes' is the step's peak *without* the data, so the two modes
    compare what the step itself needs.
    """
    device = torch.device(device) if device is not None else default_device()
    validate.counts("accumulation_steps", accumulation_steps)
    rows = []
    for k in accumulation_steps:
        effective = micro_batch * k
        for mode, count in (("accumulated", k), ("full batch", 1)):
            work = copy.deepcopy(model).to(device)
            opt = make_optimizer(optimizer, work.parameters(), lr=1e-2)
            x, y = _mlp_batch(work, effective, device=device)
            step = functools.partial(
                accumulation_step, work, opt, nn.functional.cross_entropy, x, y, count
            )
            with MemoryMeter(work, opt, track=(x, y)) as meter:
                step()
            median_s = time_op(step, device, warmup, repeat)
            data = int(meter.peak_breakdown["other"])
            rows.append(
                AccumulationRow(
                    k,
                    effective,
                    mode,
                    effective // count,
                    int(meter.peak_bytes) - data,
                    data,
                    int(meter.timeline["activations"].max()),
                    median_s,
                    effective / median_s,
                )
            )
    return kit.frame(rows, AccumulationRow)
