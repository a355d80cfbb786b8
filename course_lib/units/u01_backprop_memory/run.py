"""Where the memory of one training step goes, measured.

Introduced in notebooks/01_backprop_memory.ipynb. The forward pass caches, per layer, what backward
needs (the input u of each Linear, and z or u of each activation); backward consumes the cache and
creates one gradient per parameter; the optimizer step creates its state. Each function here runs
real steps under MemoryMeter and returns tidy pandas DataFrames next to the estimate formulas:

- step_timeline: bytes per category after every event of one step (MLP or tiny GPT);
- predict_step_memory: the formulas of course_lib.measure.estimate for one step, per category;
- measure_step_memory: the same categories, measured (each category at its own peak);
- scaling_sweep: sweep batch and width; which categories follow parameters, which batch;
- optimizer_state_comparison: SGD (0 states), momentum (1), Adam (2), measured;
- allocator_demo: on CUDA, allocated vs reserved bytes as the caching allocator keeps blocks.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd
import torch
from torch import nn

from course_lib import kit, validate
from course_lib.measure import estimate
from course_lib.measure.estimate.memory import Optimizer
from course_lib.measure.memory import MemoryMeter
from course_lib.models import GPT, MLP, MLPConfig, count_params
from course_lib.techniques import optim

#: the categories this unit predicts and measures (MemoryMeter also reports temporaries, other)
CATEGORIES = ("params", "grads", "optimizer", "activations")
#: optimizers compared in this unit (no state, one state tensor, two state tensors per parameter)
OPTIMIZERS: tuple[Optimizer, ...] = ("sgd", "momentum", "adam")


@dataclass(frozen=True)
class CategoryRow:
    """One category of one step: bytes predicted, measured, and measured - predicted."""

    category: str
    predicted: int
    measured: int
    residual: int


@dataclass(frozen=True)
class ScalingRow:
    """One category at one (batch, width) of :func:`scaling_sweep`."""

    batch: int
    width: int
    n_params: int
    category: str
    predicted: int
    measured: int
    residual: int


@dataclass(frozen=True)
class OptimizerRow:
    """One optimizer's state after one step, measured beside the estimate."""

    optimizer: str
    states_per_param: int
    predicted: int
    measured: int
    residual: int
    bytes_per_param: float


@dataclass(frozen=True)
class AllocatorRow:
    """CUDA's allocated and reserved bytes after one event of :func:`allocator_demo`."""

    event: str
    allocated: int
    reserved: int


def make_optimizer(name: str, model: nn.Module, lr: float = 1e-3) -> torch.optim.Optimizer:
    """One of :data:`OPTIMIZERS` from ``techniques.optim.make_optimizer``, with ``foreach=False``:
    the per-tensor loop keeps the step's temporaries small, so the optimizer column of the
    timeline shows the state itself rather than the batched kernels' scratch."""
    validate.choice("optimizer", name, OPTIMIZERS)
    return optim.make_optimizer(name, model.parameters(), lr=lr, foreach=False)


def make_batch(model: nn.Module, batch_shape: Sequence[int], *, device="cpu", seed: int = 0):
    """Random (inputs, targets) for `model`: MLP takes batch_shape=(B,), GPT takes (B, T)."""
    g = torch.Generator().manual_seed(seed)
    shape = tuple(int(s) for s in batch_shape)
    if isinstance(model, MLP):
        if len(shape) != 1:
            raise ValueError(f"batch_shape for an MLP is (batch,), got {batch_shape!r}")
        x = torch.randn(shape[0], model.config.in_features, generator=g)
        y = torch.randint(0, model.config.out_features, shape, generator=g)
    elif isinstance(model, GPT):
        if len(shape) != 2:
            raise ValueError(f"batch_shape for a GPT is (batch, seq), got {batch_shape!r}")
        x = torch.randint(0, model.config.vocab_size, shape, generator=g)
        y = torch.randint(0, model.config.vocab_size, shape, generator=g)
    else:
        raise TypeError(f"model must be a course_lib.models.MLP or GPT, got {type(model).__name__}")
    return x.to(device), y.to(device)


def training_step(model: nn.Module, optimizer, x, y) -> None:
    """forward (caches activations) -> backward (grads) -> step (optimizer state) -> zero_grad."""
    loss = model.loss(x, y) if isinstance(model, GPT) else nn.functional.cross_entropy(model(x), y)
    loss.backward()
    del loss  # the graph (and its cached activations) is already freed by backward
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _measure(model: nn.Module, batch_shape, optimizer: Optimizer, *, device="cpu", steps: int = 1):
    """Run `steps` training steps of a copy of `model` under MemoryMeter; return the meter."""
    steps = validate.count("steps", steps, minimum=1)
    work = copy.deepcopy(model).to(device)
    opt = make_optimizer(optimizer, work)
    x, y = make_batch(work, batch_shape, device=device)
    with MemoryMeter(work, opt) as meter:
        for _ in range(steps):
            training_step(work, opt, x, y)
    return meter


def step_timeline(
    model: nn.Module, batch_shape: Sequence[int], *, optimizer: Optimizer = "adam", device="cpu"
) -> tuple[pd.DataFrame, object]:
    """Bytes per category after each event of one training step: (timeline, meter).

    The timeline has one row per event with a column per category plus 'phase' and 'event'.
    """
    meter = _measure(model, batch_shape, optimizer, device=device)
    return meter.timeline, meter


def predict_step_memory(model: nn.Module, batch_shape: Sequence[int], optimizer: Optimizer) -> dict:
    """Predicted bytes per category for one training step of `model` (fp32).

    params, grads, optimizer come from estimate.model_state_bytes (with torch.optim's per-tensor
    step counter for Adam); activations from estimate.activation_bytes_mlp / _gpt: the bytes
    autograd has cached at the end of the forward pass, the activation peak.
    """
    if not isinstance(model, (MLP, GPT)):
        raise TypeError(f"model must be a course_lib.models.MLP or GPT, got {type(model).__name__}")
    validate.choice("optimizer", optimizer, sorted(OPTIMIZERS))
    params = list(model.parameters())
    state = estimate.model_state_bytes(
        count_params(model), precision="fp32", optimizer=optimizer, n_param_tensors=len(params)
    )
    acts: int | float
    if isinstance(model, MLP):
        (batch,) = batch_shape
        acts = estimate.activation_bytes_mlp(
            batch,
            model.config.widths,
            activation=validate.choice(
                "activation", model.config.activation, estimate.MLP_ACTIVATION_SAVES
            ),
            dtype_bytes=params[0].element_size(),
        )
    else:
        batch, seq = batch_shape
        acts = estimate.activation_bytes_gpt(
            model.config, batch, seq, dtype_bytes=params[0].element_size()
        )
    return {c: state[c] for c in ("params", "grads", "optimizer")} | {"activations": int(acts)}


def measure_step_memory(
    model: nn.Module, batch_shape: Sequence[int], optimizer: Optimizer, *, device="cpu"
) -> dict:
    """Measured bytes per category over one training step, each where it matters:

    - activations: alive when the forward pass ends (the root module's post_forward event),
      i.e. what autograd cached for backward plus the output -- the quantity the formula counts;
    - params, grads, optimizer: the largest value over the step (grads exist from backward until
      zero_grad; the optimizer state from the step on; MemoryMeter already moves the step's
      scratch buffers out of 'optimizer' into 'temporaries').

    Also returned: 'activations_peak' (the largest activation bytes at any hook, including
    forward transients such as a pre-activation z not yet freed), 'temporaries' (their largest
    value) and 'peak' (the step's overall peak, MemoryMeter.peak_bytes).
    """
    meter = _measure(model, batch_shape, optimizer, device=device)
    tl = meter.timeline
    out = {c: int(tl[c].max()) for c in ("params", "grads", "optimizer", "temporaries")}
    end_of_forward = tl[tl["event"] == "post_forward"].iloc[-1]  # the root module's, last one
    out["activations"] = int(end_of_forward["activations"])
    out["activations_peak"] = int(tl["activations"].max())
    out["peak"] = int(meter.peak_bytes)
    return out


def compare_step_memory(
    model: nn.Module, batch_shape: Sequence[int], optimizer: Optimizer = "adam", *, device="cpu"
) -> pd.DataFrame:
    """One row per category: predicted, measured, residual (measured - predicted), in bytes."""
    pred = predict_step_memory(model, batch_shape, optimizer)
    meas = measure_step_memory(model, batch_shape, optimizer, device=device)
    rows = [
        CategoryRow(c, pred.get(c, 0), meas[c], meas[c] - pred.get(c, 0))
        for c in (*CATEGORIES, "temporaries")
    ]
    return kit.frame(rows, CategoryRow)


def scaling_sweep(
    *,
    batches: Sequence[int] = (16, 64, 256),
    widths: Sequence[int] = (64, 256),
    in_features: int = 64,
    depth: int = 2,
    optimizer: Optimizer = "adam",
    device="cpu",
) -> pd.DataFrame:
    """Measured and predicted bytes per category over a grid of batch size x hidden width.

    Model state (params, grads, optimizer) depends on the width only; activations on
    batch x width. One row per (batch, width, category).
    """
    rows: list[ScalingRow] = []
    for width in widths:
        model = MLP(MLPConfig(in_features=in_features, hidden=(width,) * depth))
        for batch in batches:
            pred = predict_step_memory(model, (batch,), optimizer)
            meas = measure_step_memory(model, (batch,), optimizer, device=device)
            n = count_params(model)
            rows += [
                ScalingRow(batch, width, n, c, pred[c], meas[c], meas[c] - pred[c])
                for c in CATEGORIES
            ]
    return kit.frame(rows, ScalingRow)


def optimizer_state_comparison(
    model: nn.Module,
    batch_shape: Sequence[int],
    *,
    optimizers: Sequence[Optimizer] = ("sgd", "momentum", "adam"),
    device="cpu",
) -> pd.DataFrame:
    """Measured optimizer-state bytes after one step, per optimizer, beside the estimate."""
    n = count_params(model)
    rows = []
    for name in optimizers:
        got = measure_step_memory(model, batch_shape, name, device=device)["optimizer"]
        pred = predict_step_memory(model, batch_shape, name)["optimizer"]
        states = estimate.STATE_TENSORS_PER_PARAM[name]
        rows.append(OptimizerRow(name, states, pred, got, got - pred, got / n))
    return kit.frame(rows, OptimizerRow)


def allocator_demo(nbytes: int = 64 * 2**20, *, device=None) -> pd.DataFrame:
    """CUDA only: allocated vs reserved bytes as a tensor is created, freed, and created again.

    torch's caching allocator keeps freed blocks reserved for reuse, so 'reserved' stays up after
    the free; empty_cache() hands them back to the driver. Raises RuntimeError without CUDA.
    """
    if not torch.cuda.is_available():
        raise RuntimeError("allocator_demo needs a CUDA device; torch.cuda.is_available() is False")
    device = torch.device(device) if device is not None else torch.device("cuda", 0)
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    rows = []

    def record(event: str) -> None:
        torch.cuda.synchronize(device)
        used = torch.cuda.memory_allocated(device), torch.cuda.memory_reserved(device)
        rows.append(AllocatorRow(event, *used))

    record("start")
    t = torch.empty(nbytes // 4, device=device)
    record(f"allocate {estimate.fmt_bytes(nbytes)}")
    del t
    record("free (del)")
    t = torch.empty(nbytes // 4, device=device)
    record("allocate again (reuses the block)")
    del t
    torch.cuda.empty_cache()
    record("free + empty_cache()")
    return kit.frame(rows, AllocatorRow)
