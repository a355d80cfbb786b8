"""Reduced and mixed precision, measured.

Introduced in notebooks/03_mixed_precision.ipynb. Measured runs, each returning a pandas DataFrame:

- :func:`format_table` and :func:`rounding_table`: the float formats, read from ``torch.finfo``,
  and what happens to a few values (gradients, weights, updates) stored in each;
- :func:`gradient_histogram`: the activation gradients of a real tiny-GPT backward, and the share
  that would underflow in fp16 (Micikevicius et al. 2017, Fig. 3) with and without loss scaling;
- :func:`tiny_updates`: many small updates applied to bf16 weights vs to fp32 master weights;
- :func:`training_memory`: model state and activations of one training step of the tiny GPT in
  every recipe, measured with MemoryMeter beside ``estimate.model_state_bytes``;
- :func:`matmul_speed`: matmul throughput per dtype on this machine (timed, never graded);
- :func:`loss_curves`: the same training run in every recipe, with GradScaler's scale and skips.

Plain data out; plots in course_lib.units.u03_mixed_precision.plots.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import pandas as pd
import torch

from course_lib import kit, validate
from course_lib.data import permutation_batch
from course_lib.measure import estimate
from course_lib.measure.estimate.memory import Precision
from course_lib.models import GPT, GPTConfig, count_params
from course_lib.runtime.device import default_device
from course_lib.techniques import precision as P
from course_lib.units.u03_mixed_precision.run_formats import (  # noqa: F401 (re-exported)
    RoundingRow,
    UnderflowRow,
    _formats,
    format_table,
    gradient_histogram,
    rounding_table,
    underflow_fractions,
)


@dataclass(frozen=True)
class UpdateRow:
    """One weight after many tiny updates, in one storage recipe (:func:`tiny_updates`)."""

    recipe: str
    final: float
    exact: float
    rel_error: float
    update_per_weight: float = field(metadata=kit.column("update/weight"))
    half_eps: float = field(metadata=kit.column("eps/2 of storage"))


@dataclass(frozen=True)
class ModeMemoryRow:
    """One category of one Adam step in one recipe (:func:`training_memory`), in bytes."""

    mode: str
    category: str
    measured: int
    predicted: int
    residual: int


@dataclass(frozen=True)
class MatmulRow:
    """An (n x n) @ (n x n) matmul in one dtype, timed (:func:`matmul_speed`)."""

    n: int
    dtype: str
    median_s: float
    p10_s: float
    p90_s: float
    gflops: float


@dataclass(frozen=True)
class LossRow:
    """One training step of one recipe (:func:`loss_curves`)."""

    mode: str
    step: int
    loss: float
    skipped: bool
    scale: float
    seconds: float


# --------------------------------------------------------------------------------------------
# one model; the learnable task is course_lib.data.permutation_batch (re-exported here)
# --------------------------------------------------------------------------------------------
def _model(config: GPTConfig, seed: int, device: torch.device | str) -> GPT:
    torch.manual_seed(seed)
    return GPT(config).to(device)


# --------------------------------------------------------------------------------------------
# tiny updates: why master weights exist
# --------------------------------------------------------------------------------------------
def tiny_updates(*, weight: float = 1.0, update: float = 1e-3, steps: int = 100) -> pd.DataFrame:
    """Add ``update`` to ``weight`` ``steps`` times, with the weight stored in fp32, bf16, fp16,
    and in bf16 with an fp32 master copy (the master is updated, the bf16 weight re-cast from it).
    Returns one row per recipe with the final weight, the exact answer and the relative error."""
    steps = validate.count("steps", steps, minimum=1)
    exact = weight + steps * update
    rows = []
    for name, store, master in (
        ("fp32", torch.float32, False),
        ("bf16", torch.bfloat16, False),
        ("fp16", torch.float16, False),
        ("bf16 + fp32 master", torch.bfloat16, True),
    ):
        w = torch.tensor([weight], dtype=store)
        m = torch.tensor([weight], dtype=torch.float32)
        u = torch.tensor([update], dtype=torch.float32)
        for _ in range(steps):
            if master:
                m += u
                w = m.to(store)
            else:
                w += u.to(store)
        final = float(w.float())
        fmt = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[store]
        error = abs(final - exact) / abs(exact)
        half_eps = P.bit_layout(fmt).eps / 2
        rows.append(UpdateRow(name, final, exact, error, update / weight, half_eps))
    return kit.frame(rows, UpdateRow)


# --------------------------------------------------------------------------------------------
# memory of one training step, per recipe
# --------------------------------------------------------------------------------------------
def _measured_step(
    mode: Precision, config: GPTConfig, batch: int, seq: int, seed: int, device: torch.device
) -> tuple[Any, int, int]:
    """(MemoryMeter over the second Adam step of ``mode``, parameter count, parameter tensors);
    the first step creates the Adam state."""
    from course_lib.measure.memory import MemoryMeter

    model = P.prepare(_model(config, seed, device), mode)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    scaler = P.make_scaler(mode, device)
    gen = torch.Generator().manual_seed(seed)
    idx, tgt = permutation_batch(config, batch, seq, generator=gen, device=device)

    def loss_fn(m: Any) -> torch.Tensor:
        loss: torch.Tensor = m.loss(idx, tgt)
        return loss

    P.train_step(model, opt, loss_fn, mode=mode, scaler=scaler)  # creates the Adam state
    with MemoryMeter(model, opt) as mem:
        P.train_step(model, opt, loss_fn, mode=mode, scaler=scaler)
    return mem, count_params(model), len(list(model.parameters()))


def training_memory(
    modes: Sequence[Precision] = P.MODES,
    *,
    config: GPTConfig | None = None,
    batch: int = 8,
    seq: int = 64,
    seed: int = 0,
    device: torch.device | str | None = None,
) -> pd.DataFrame:
    """One Adam training step of the tiny GPT per recipe, measured with MemoryMeter.

    A first step creates the optimizer state; the second is measured. One row per (mode,
    category) with ``measured`` and ``predicted`` bytes and their ``residual``:

    * params / grads / optimizer: state alive at the end of the step vs
      ``estimate.model_state_bytes(precision=mode, optimizer="adam")`` (whose ``master`` is
      added to ``params``: autocast's fp32 parameters *are* the master weights);
    * activations: the most activation bytes alive at any moment of MemoryMeter's timeline vs ``estimate.activation_bytes_gpt`` with
      4-byte (fp32) or 2-byte (the other recipes) values;
    * peak: the measured peak of the whole step (predicted: the sum of the rows above).
    """
    config = config or GPTConfig.tiny()
    device = torch.device(device) if device is not None else default_device()
    rows = []
    for mode in modes:
        P._mode(mode)
        mem, n_params, n_tensors = _measured_step(mode, config, batch, seq, seed, device)
        pred = estimate.model_state_bytes(
            n_params, precision=mode, optimizer="adam", n_param_tensors=n_tensors
        )
        act = estimate.activation_bytes_gpt(
            config, batch, seq, dtype_bytes=4 if mode == "fp32" else 2
        )
        meas = {
            "params": mem.end_breakdown["params"],
            "grads": mem.end_breakdown["grads"],
            "optimizer": mem.end_breakdown["optimizer"],
            # the most activations alive at any recorded moment (end of forward, in general)
            "activations": int(mem.timeline["activations"].max()),
        }
        predicted = {
            "params": pred["params"] + pred["master"],
            "grads": pred["grads"],
            "optimizer": pred["optimizer"],
            "activations": act,
        }
        predicted["peak"] = sum(predicted.values())
        meas["peak"] = mem.peak_bytes
        for cat in ("params", "grads", "optimizer", "activations", "peak"):
            got, want = int(meas[cat]), int(predicted[cat])
            rows.append(ModeMemoryRow(mode, cat, got, want, got - want))
    return kit.frame(rows, ModeMemoryRow)


# --------------------------------------------------------------------------------------------
# matmul speed per dtype
# --------------------------------------------------------------------------------------------
def matmul_speed(
    sizes: Sequence[int] = (256, 512),
    dtypes: Sequence[str] = ("fp32", "bf16", "fp16"),
    *,
    warmup: int = 2,
    repeat: int = 5,
    device: torch.device | str | None = None,
    cpu_threads: int | None = 1,
) -> pd.DataFrame:
    """Median time and throughput of an (n x n) @ (n x n) matmul per dtype (timed here; noisy on a
    shared machine, never graded). FLOPs from ``estimate.matmul_flops``.

    On the CPU the matmuls run on ``cpu_threads`` threads (default 1, restored afterwards): on a
    small shared machine a multi-threaded kernel waits for its slowest thread, and a core busy
    with another process makes every timing jump by a scheduler time slice. None keeps PyTorch's
    setting."""
    from course_lib.measure.timing import time_fn

    device = torch.device(device) if device is not None else default_device()
    if cpu_threads is not None:
        cpu_threads = validate.count("cpu_threads", cpu_threads, minimum=1)
    saved_threads = torch.get_num_threads()
    if device.type == "cpu" and cpu_threads is not None:
        torch.set_num_threads(cpu_threads)
    try:
        return _matmul_rows(sizes, dtypes, warmup, repeat, device, time_fn)
    finally:
        torch.set_num_threads(saved_threads)


def _matmul_rows(
    sizes: Sequence[int],
    dtypes: Sequence[str],
    warmup: int,
    repeat: int,
    device: torch.device,
    time_fn: Callable[..., Any],
) -> pd.DataFrame:
    rows = []
    for n in sizes:
        n = validate.count("sizes", n, minimum=1)  # each size
        for f in _formats(dtypes):
            dt = P.FORMATS[f]
            if dt.itemsize == 1:
                raise ValueError(
                    f"dtypes = {validate.describe(dtypes)}: expected fp32, bf16 or fp16 here "
                    f"({f} matmul needs torch._scaled_mm on a GPU with fp8 support)"
                )
            a = torch.randn(n, n, device=device).to(dt)
            b = torch.randn(n, n, device=device).to(dt)
            res = time_fn(lambda a=a, b=b: torch.mm(a, b), warmup=warmup, repeat=repeat)
            gflops = estimate.matmul_flops(n, n, n) / res.median_s / 1e9
            rows.append(MatmulRow(n, f, res.median_s, res.p10_s, res.p90_s, gflops))
    return kit.frame(rows, MatmulRow)


# --------------------------------------------------------------------------------------------
# loss curves per recipe
# --------------------------------------------------------------------------------------------
def loss_curves(
    modes: Sequence[Precision] = P.MODES,
    *,
    steps: int = 30,
    config: GPTConfig | None = None,
    batch: int = 8,
    seq: int = 16,
    lr: float = 1e-2,
    seed: int = 0,
    init_scale: float = 2.0**16,
    growth_interval: int = 2000,
    device: torch.device | str | None = None,
) -> pd.DataFrame:
    """Train the tiny GPT on the permutation task (:func:`course_lib.data.permutation_batch`) for
    ``steps`` Adam steps in each recipe (same seed, same batches). Rows: mode, step, loss, skipped (fp16 loss scaling found inf/NaN), scale,
    seconds (wall time of that training step, synchronized on CUDA: timed here, noisy, never graded).
    ``init_scale`` and ``growth_interval`` go to ``torch.amp.GradScaler`` for fp16-mixed."""
    steps = validate.count("steps", steps, minimum=1)
    config = config or GPTConfig.tiny()
    device = torch.device(device) if device is not None else default_device()
    rows = []
    for mode in modes:
        P._mode(mode)
        model = P.prepare(_model(config, seed, device), mode)
        opt = torch.optim.Adam(model.parameters(), lr=lr)
        scaler = P.make_scaler(mode, device, init_scale=init_scale, growth_interval=growth_interval)
        gen = torch.Generator().manual_seed(seed + 1)
        for step in range(steps):
            idx, tgt = permutation_batch(config, batch, seq, generator=gen, device=device)

            def loss_fn(m: Any, idx: torch.Tensor = idx, tgt: torch.Tensor = tgt) -> torch.Tensor:
                loss: torch.Tensor = m.loss(idx, tgt)
                return loss

            t0 = time.perf_counter()
            r = P.train_step(model, opt, loss_fn, mode=mode, scaler=scaler)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            seconds = time.perf_counter() - t0
            rows.append(LossRow(mode, step, r.loss, r.skipped, r.scale, seconds))
    return kit.frame(rows, LossRow)
