"""What crosses the process boundary of a virtual-cluster simulation: the checked arguments
(:class:`SimSpec`, sent to the simulating process) and the plain numbers it sends back
(:class:`StepResult`). No torch. Introduced in notebooks/10_zero_fsdp.ipynb.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from course_lib.measure.estimate.activations import RECOMPUTE as RECOMPUTE  # simulate's

Strategy = Literal["fsdp", "fsdp_no_reshard", "tp", "fsdp+tp", "ddp"]
MixedPrecision = Literal["bf16", "fp16"] | None
Optimizer = Literal["adamw", "adam", "sgd"]
Checkpoint = Literal["full", "selective"] | None  # a Recompute ("none" is None here)


@dataclass(frozen=True)
class SimSpec:
    """The checked arguments of one ``simulate_step`` (see its docstring for each)."""

    model_fn: Callable[[], Any]
    world_size: int
    strategy: Strategy
    tp: int  # tensor-parallel degree (1 without tensor parallelism)
    mixed_precision: MixedPrecision
    batch: int
    seq: int  # tokens per sequence
    vocab: int
    reshard_after_forward: bool
    optimizer: Optimizer
    checkpoint: Checkpoint
    timeout: float  # seconds for the whole simulation
    fast_chunks: bool = True
    count_comm: bool = True


@dataclass(frozen=True)
class StepResult:
    """The simulating process's answer: bytes per category (row name -> bytes on rank 0) at
    each moment, and how the run went."""

    at_peak: dict[str, int]  # at the forward + backward peak of the total
    max: dict[str, int]  # each category's largest value at the tracker's sampling points
    after_forward: dict[str, int]
    after_backward: dict[str, int]
    after_step: dict[str, int]
    step_peak_total: int  # the optimizer step's traced peak (inflated: see simulate_step)
    activation_peak: dict[str, int]  # every category when activations + temporaries peaked
    comm: dict[str, Any] | None  # CommDebugMode's counts: total / forward / backward
    n_params_local: int
    phases_s: dict[str, float]  # CPU seconds: setup, forward, backward, step
    wall_s: float  # CPU seconds of the simulating process
    rss_peak_bytes: int
    pid: int
    torch: str  # torch.__version__ in the simulating process
