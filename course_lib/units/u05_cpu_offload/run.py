"""CPU offload, measured (notebooks/05_cpu_offload.ipynb).

Measured runs, each returning a pandas DataFrame or plain data:

- :func:`parity`: ``OffloadAdamW`` against the plain optimizer, K steps, largest difference;
- :func:`memory_fit`: device memory of a step with and without offload (MemoryMeter), beside
  ``estimate.offload_split``, against a (simulated, on CPU) device budget;
- :func:`tier_bandwidth`: the tiers of this machine -- RAM copy, file write + fsync, file read with
  the page cache dropped, cached file read -- in GB/s; :func:`h2d_bandwidth` (CUDA only): pinned
  vs pageable host-to-device copies;
- :func:`step_breakdown`: every measured part of an offloaded step and its total, beside
  ``estimate.offload_step_time`` (serial and overlapped);
- :func:`fsdp_offload_parity`: FSDP2 ``fully_shard(..., offload_policy=CPUOffloadPolicy())`` on 2
  ranks against one process (the harness of ``course_lib.parallel``);
- :func:`scale_up`: the same formulas at 7B and 70B (estimate only: nothing is measured).

Plain data out; plots in course_lib.units.u05_cpu_offload.plots.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

import pandas as pd
import torch

from course_lib import kit, validate
from course_lib.data import permutation_batch
from course_lib.measure import estimate
from course_lib.measure.estimate.offload import OffloadLevel, OffloadPrecision
from course_lib.models import GPTConfig, count_params
from course_lib.techniques.offload import OffloadAdamW
from course_lib.units.u05_cpu_offload._setup import (  # noqa: F401 (PARTS: re-exported)
    CONFIG,
    LR,
    PARTS,
    _models,
    _plain_optimizer,
)
from course_lib.units.u05_cpu_offload.run_bandwidth import (  # noqa: F401 (re-exported)
    h2d_bandwidth,
    predicted_step_times,
    step_breakdown,
    tier_bandwidth,
)

if TYPE_CHECKING:
    from course_lib.measure.memory import MemoryMeter


# --------------------------------------------------------------------------------------------
# parity
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ParityRow:
    """Plain vs offloaded AdamW after the same steps, one dtype and tier (:func:`parity`)."""

    dtype: str
    tier: str
    steps: int
    max_abs_diff: float
    min_param_moved: float
    to_host_bytes: int
    to_device_bytes: int
    n_params: int


@dataclass(frozen=True)
class FitRow:
    """Device and host bytes of one training step, plain or offloaded (:func:`memory_fit`)."""

    run: str
    level: str
    model_state_predicted: int
    model_state_measured: int
    activations: int
    peak: int
    peak_phase: str
    host_predicted: int
    host_measured: int
    host_buffers: int
    n_params: int


@dataclass(frozen=True)
class ScaleRow:
    """One model size's offloaded step, estimated (:func:`scale_up`)."""

    params: str
    device_GB: float = field(metadata=kit.column("device GB"))
    host_GB: float = field(metadata=kit.column("host GB"))
    each_way_GB: float = field(metadata=kit.column("each way GB"))
    compute_s: float = field(metadata=kit.column("compute s"))
    transfer_s: float = field(metadata=kit.column("transfer s (each way)"))
    host_adam_s: float = field(metadata=kit.column("host Adam s"))
    overlapped_s: float = field(metadata=kit.column("overlapped s"))
    serial_s: float = field(metadata=kit.column("serial s"))
    no_offload_s: float = field(metadata=kit.column("no offload s"))


@dataclass(frozen=True)
class PlacementRow:
    """Where one rank keeps one parameter under FSDP2 (:func:`fsdp_offload_parity`)."""

    name: str
    type: str
    device: str
    local_shape: tuple[int, ...]
    full_shape: tuple[int, ...]


def parity(
    *,
    steps: int = 5,
    dtypes: Sequence[torch.dtype] = (torch.float32, torch.bfloat16),
    tiers: Sequence[str] = ("memory", "file"),
    config: GPTConfig | None = None,
    batch: int = 4,
    device: str = "cpu",
) -> pd.DataFrame:
    """Train two copies of the model ``steps`` steps on the same batches, one with the plain
    optimizer (AdamW; for bf16 the master-weights recipe of unit 04), one with ``OffloadAdamW``.
    One row per (dtype, tier): the largest |difference| of any parameter, the largest distance
    any parameter moved from its start (so 0 difference cannot mean "nothing happened"), and
    the bytes moved each way in the last step."""
    steps = validate.count("steps", steps, minimum=1)
    config = config or CONFIG
    rows = []
    for dtype in dtypes:
        for tier in tiers:
            plain, off = _models(config, dtype, device)
            start = [p.detach().clone() for p in plain.parameters()]
            ref_opt = _plain_optimizer(plain, dtype)
            opt = OffloadAdamW(off.parameters(), lr=LR, tier=tier)
            gen = torch.Generator().manual_seed(1)
            for _ in range(steps):
                idx, tgt = permutation_batch(config, batch, config.block_size, generator=gen)
                idx, tgt = idx.to(device), tgt.to(device)
                for model, o in ((plain, ref_opt), (off, opt)):
                    o.zero_grad(set_to_none=True)
                    model.loss(idx, tgt).backward()
                    o.step()
            with torch.no_grad():
                diff = max(
                    float((a.float() - b.float()).abs().max())
                    for a, b in zip(plain.parameters(), off.parameters())
                )
                moved = min(
                    float((a.float() - s.float()).abs().max())
                    for a, s in zip(plain.parameters(), start)
                )
            rows.append(
                ParityRow(
                    str(dtype).removeprefix("torch."),
                    tier,
                    steps,
                    diff,
                    moved,
                    opt.bytes_moved["to_host"],
                    opt.bytes_moved["to_device"],
                    count_params(off),
                )
            )
            opt.close()
    return kit.frame(rows, ParityRow)


# --------------------------------------------------------------------------------------------
# device memory, with and without offload
# --------------------------------------------------------------------------------------------
def _measure_plain_step(plain, ref, idx, tgt, device: str):
    """MemoryMeter over the second plain step (the first creates the Adam state)."""
    from course_lib.measure.memory import MemoryMeter

    inner = ref if isinstance(ref, torch.optim.Optimizer) else ref.optimizer
    master = [] if isinstance(ref, torch.optim.Optimizer) else ref.master
    for measured in (False, True):
        ref.zero_grad(set_to_none=True)
        if measured:
            with MemoryMeter(plain, inner, track=master, device=device) as mem:
                plain.loss(idx, tgt).backward()
                ref.step()
        else:
            plain.loss(idx, tgt).backward()
            ref.step()
    return mem


def _measure_offloaded_step(off, idx, tgt, device: str):
    """(MemoryMeter over the device's part of the second offloaded step, the optimizer)."""
    from course_lib.measure.memory import MemoryMeter

    opt = OffloadAdamW(off.parameters(), lr=LR)
    for measured in (False, True):
        opt.zero_grad(set_to_none=True)
        if measured:
            with MemoryMeter(off, device=device) as mem:
                off.loss(idx, tgt).backward()
                opt.offload_grads()
        else:
            off.loss(idx, tgt).backward()
            opt.offload_grads()
        opt.host_step()
        opt.load_params()
    return mem, opt


def memory_fit(
    *,
    config: GPTConfig | None = None,
    batch: int = 4,
    dtype: torch.dtype = torch.bfloat16,
    device: str = "cpu",
) -> pd.DataFrame:
    """Device memory of one training step, plain and offloaded, measured with MemoryMeter.

    Plain: the master-weights recipe (bf16 model, fp32 master, AdamW; unit 04) -- everything on
    the device; the meter wraps forward, backward and the optimizer step (after a first step, so
    the Adam state exists). Offloaded: ``OffloadAdamW``; the meter wraps forward, backward and
    ``offload_grads`` -- the device's part of the step; the host update and the copy back run
    outside it (on a GPU they touch host memory, which the meter of the device does not count;
    ``load_params`` writes into the existing parameters and allocates nothing on the device).

    Columns: ``model_state_predicted`` (``estimate.offload_split(...)["device"]``, level
    "none" / "optimizer"), ``model_state_measured`` (params + grads + optimizer + master at the
    peak), ``activations`` (activations + temporaries at the peak), ``peak`` (bytes),
    ``host_predicted`` / ``host_measured`` (bytes the host keeps).
    """
    config = config or CONFIG
    plain, off = _models(config, dtype, device)
    n = count_params(plain)
    precision: OffloadPrecision = "fp32" if dtype == torch.float32 else "bf16-mixed"
    gen = torch.Generator().manual_seed(1)
    idx, tgt = (
        t.to(device) for t in permutation_batch(config, batch, config.block_size, generator=gen)
    )

    mem_plain = _measure_plain_step(plain, _plain_optimizer(plain, dtype), idx, tgt, device)
    mem_off, opt = _measure_offloaded_step(off, idx, tgt, device)
    rows = []
    runs: tuple[tuple[str, OffloadLevel, MemoryMeter, dict[str, int] | None], ...] = (
        ("plain (all on device)", "none", mem_plain, None),
        ("offloaded optimizer", "optimizer", mem_off, opt.host_bytes()),
    )
    for label, level, mem, host in runs:
        bd = mem.peak_breakdown
        split = estimate.offload_split(n, level=level, precision=precision, optimizer="adamw")
        rows.append(
            FitRow(
                label,
                level,
                split["device"],
                bd["params"] + bd["grads"] + bd["optimizer"] + bd["other"],
                bd["activations"] + bd["temporaries"],
                mem.peak_bytes,
                mem.peak_phase,
                split["host"],
                0 if host is None else host["master"] + host["optimizer"],
                0 if host is None else host["grads"] + host["staging"],
                n,
            )
        )
    return kit.frame(rows, FitRow).set_index("run")


# --------------------------------------------------------------------------------------------
# FSDP2's CPU offload, in ranks
# --------------------------------------------------------------------------------------------
def _fsdp_model(seed: int):
    from course_lib.models import MLP, MLPConfig

    torch.manual_seed(seed)
    # float64: Adam turns the rounding noise of near-zero gradients into visible steps (see
    # course_lib.parallel.harness); in float64 that noise is 2**29 times smaller
    return MLP(MLPConfig(in_features=8, hidden=(32, 32), out_features=1)).double()


def _fsdp_batch(step: int):
    from course_lib.data import regression_task

    x, y = regression_task(16, 8, seed=step)
    return x.double(), y.double()


def _fsdp_rank(rank: int, world_size: int, steps: int):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard

    from course_lib.parallel.harness import make_optimizer_fn, parallel_run

    model = _fsdp_model(0)
    # a CPU mesh, as the model and its batches are on the CPU: without one, FSDP2 builds its
    # mesh on the machine's GPU whatever the backend ("invalid device ordinal" on rank 1)
    mesh = init_device_mesh("cpu", (world_size,))
    policy = CPUOffloadPolicy(pin_memory=False)  # pinning is for copies to a GPU
    for layer in model.modules():
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh, offload_policy=policy)
    fully_shard(model, mesh=mesh, offload_policy=policy)
    where = [
        PlacementRow(
            name,
            type(p).__name__,
            str(p.to_local().device),
            tuple(p.to_local().shape),
            tuple(p.shape),
        )
        for name, p in model.named_parameters()
    ]
    record = parallel_run(
        model,
        _fsdp_batch,
        steps=steps,
        shard=(rank, world_size),
        optimizer_fn=make_optimizer_fn("adamw", lr=LR),
    )
    return record, where


def fsdp_offload_parity(
    *, steps: int = 3, world_size: int = 2
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """FSDP2 with ``CPUOffloadPolicy`` on ``world_size`` gloo ranks against one process on the
    full batch (AdamW, ``steps`` steps, float64 MLP). Returns ``(table, where)``: the harness's
    comparison table (one row per step, rank and tensor) and where rank 0 keeps each parameter
    (a DTensor shard on the CPU)."""
    import course_lib
    from course_lib.parallel.harness import compare, make_optimizer_fn, reference_run

    steps = validate.count("steps", steps, minimum=1)
    out = course_lib.launch(_fsdp_rank, world_size, steps, timeout=120.0)
    ref = reference_run(
        _fsdp_model, _fsdp_batch, steps=steps, optimizer_fn=make_optimizer_fn("adamw", lr=LR)
    )
    table = compare(ref, [r for r, _ in out])
    where = kit.frame(out[0][1], PlacementRow).set_index("name").rename_axis(None)
    return table, where


# --------------------------------------------------------------------------------------------
# 7B and 70B, estimated
# --------------------------------------------------------------------------------------------
def scale_up(
    n_params: Sequence[float] = (7e9, 70e9),
    *,
    tokens_per_step: int = 16 * 4096,
    link: str = "PCIe 4.0 x16",
    host_GBps: float = 100.0,
    gpu_TFLOPs: float = 989.0,
    mfu: float = 0.5,
) -> pd.DataFrame:
    """Estimated offloaded step at scale, one row per model size, level ``optimizer``,
    bf16-mixed AdamW, one GPU: device and host GB, the step's parts in seconds -- compute =
    6 N tokens / (peak x MFU) (``estimate.training_flops_per_token``), transfer each way on
    ``link`` (``estimate.offload_transfer_times``), host Adam at ``host_GBps``
    (``estimate.host_adam_time``) -- and the step time overlapped and serial, beside the step
    without offload (compute only, if it fitted)."""
    link_GBps = estimate.link_speed(link).per_direction_GBps
    rows = []
    for n in n_params:
        n = validate.count("n_params", n, minimum=1)
        split = estimate.offload_split(n, level="optimizer")
        compute = estimate.training_flops_per_token(n) * tokens_per_step / (gpu_TFLOPs * 1e12 * mfu)
        tr = estimate.offload_transfer_times(n, link_GBps=link_GBps)
        host = estimate.host_adam_time(n, host_GBps=host_GBps)
        rows.append(
            ScaleRow(
                f"{n / 1e9:g}B",
                split["device"] / 1e9,
                split["host"] / 1e9,
                split["to_host"] / 1e9,
                compute,
                tr["duplex_s"],
                host,
                estimate.offload_step_time(
                    compute_s=compute, transfer_s=tr["duplex_s"], host_s=host
                ),
                estimate.offload_step_time(
                    compute_s=compute, transfer_s=tr["serial_s"], host_s=host, overlap=False
                ),
                compute,
            )
        )
    return kit.frame(rows, ScaleRow).set_index("params")
