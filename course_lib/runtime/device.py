"""Which backend and device a run uses, and what hardware this machine has.

Introduced in notebooks/00_start_here.ipynb, which prints :func:`hardware_report`.

The rule (README.md, "On a GPU or a cluster"): NCCL with one GPU per rank when there are at least as many
GPUs as ranks, otherwise gloo on CPU. A single GPU never hosts two NCCL ranks: NCCL refuses two
ranks on one device, and sharing one GPU between processes would measure contention, not the
technique being taught.

``COURSE_LIB_BACKEND`` (``gloo`` or ``nccl``), when set, is what ``auto`` means: the exported
cluster experiments (``course_lib.cluster``) set it to ``gloo`` because they keep their tensors on
the CPU, so that ``launch`` and torchrun make the same choice on a GPU node too.
"""

from __future__ import annotations

import os
import platform
from typing import Any

import psutil
import torch
import torch.distributed as dist

from course_lib import validate
from course_lib.runtime.protocol import Backend

BACKENDS = ("auto", "gloo", "nccl")
BACKEND_VARIABLE = "COURSE_LIB_BACKEND"

# CPU feature flags (Linux /proc/cpuinfo names) that mean bf16 arithmetic runs natively.
_BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")  # bf16: the aarch64 "Features" name


def check_backend_name(backend: object) -> None:
    """Raise TypeError/ValueError unless ``backend`` is one of :data:`BACKENDS`."""
    if not isinstance(backend, str):
        raise TypeError(
            f"backend = {validate.describe(backend)}: expected a str, one of {', '.join(BACKENDS)}"
        )
    validate.choice("backend", backend, BACKENDS)


def resolve_backend(backend: str, world_size: int) -> Backend:
    """Turn ``backend`` ('auto', 'gloo' or 'nccl') into the backend a run of ``world_size``
    ranks will use; raise ValueError, before any process starts, if it cannot work here."""
    check_backend_name(backend)
    forced = os.environ.get(BACKEND_VARIABLE)
    if backend == "auto" and forced:
        if forced not in ("gloo", "nccl"):
            raise ValueError(
                f"{BACKEND_VARIABLE} = {forced!r}: expected 'gloo' or 'nccl' (or "
                "unset it to let backend='auto' choose)"
            )
        backend = forced
    n_gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if backend == "auto":
        return "nccl" if dist.is_nccl_available() and n_gpus >= world_size else "gloo"
    if backend == "nccl":
        if not dist.is_nccl_available():
            raise ValueError(
                "backend = 'nccl': expected a backend this PyTorch build has; NCCL is not "
                f"available in this PyTorch build (torch {torch.__version__}); use "
                "backend='gloo' or 'auto'"
            )
        if n_gpus < world_size:
            raise ValueError(
                f"world_size = {world_size}: expected at most {n_gpus} with backend='nccl' "
                f"(one GPU per rank; torch.cuda.device_count() found {n_gpus} GPU(s)); use "
                f"world_size<={n_gpus}, or backend='gloo' / 'auto' to run on CPU"
            )
    if backend == "gloo" and not dist.is_gloo_available():
        raise ValueError(
            "backend = 'gloo': expected a backend this PyTorch build has; gloo is not "
            "available in this PyTorch build; use backend='nccl' or 'auto'"
        )
    return "nccl" if backend == "nccl" else "gloo"


def group_backend(backend: str) -> str:
    """What the ranks pass to ``init_process_group`` for the backend ``launch`` resolved:
    under NCCL, ``"cpu:gloo,cuda:nccl"``, so a collective on GPU tensors goes through NCCL and
    one on CPU tensors through gloo. Most of the course's rank code builds CPU tensors; with NCCL
    alone they fail ("No backend type associated with device type cpu") on any machine with a
    GPU per rank, where ``backend="auto"`` picks NCCL."""
    return "cpu:gloo,cuda:nccl" if backend == "nccl" else backend


def default_device() -> torch.device:
    """The one device a single-process unit runs on: the first GPU if there is one, else the CPU.

    Units 01-07 run on it; multi-rank code uses :func:`rank_device` instead."""
    return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")


def sync(device: torch.device | str | None = None) -> None:
    """Wait for the device's queued work (CUDA kernels run asynchronously); no-op on CPU.
    ``None``: the current CUDA device, if this process has initialised CUDA (no-op otherwise).
    Every timer in the course calls it before reading the clock."""
    if device is None:
        # torch's stubs leave is_initialized unannotated
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()
        return
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def rank_device() -> torch.device:
    """The device this rank computes on: ``cuda:<local rank>`` under NCCL, else ``cpu``.

    Works the same inside :func:`course_lib.launch` and under torchrun (both set LOCAL_RANK).
    Outside any process group it returns ``cpu``.
    """
    if dist.is_available() and dist.is_initialized() and "nccl" in str(dist.get_backend()):
        local_rank = int(os.environ.get("LOCAL_RANK", dist.get_rank() % torch.cuda.device_count()))
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def _cpu_info() -> tuple[str, set[str]]:
    """CPU model name and feature flags from /proc/cpuinfo (Linux); platform fallback."""
    model, flags = "", set[str]()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip().lower()
                if key in ("model name", "hardware") and not model:
                    model = value.strip()
                elif key in ("flags", "features") and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    return model or platform.processor() or platform.machine() or "unknown", flags


def hardware_report() -> dict[str, Any]:
    """What this machine offers for training, as a plain dict (see :func:`format_hardware_report`).

    Keys: cpu_model, cpu_physical_cores, cpu_logical_cores, ram_gib (GiB = 1024**3 B),
    cpu_bf16_native (True/False, or None where CPU flags cannot be read), cpu_bf16_flags,
    gpus (list of {index, name, memory_gib, compute_capability, bf16}), torch_version,
    cuda_version (None on a CPU build), distributed_backends ({gloo, nccl, mpi: bool}),
    platform.
    """
    model, flags = _cpu_info()
    bf16_flags = sorted(f for f in _BF16_CPU_FLAGS if f in flags)
    gpus = []
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            gpus.append(
                {
                    "index": i,
                    "name": props.name,
                    "memory_gib": round(props.total_memory / 1024**3, 1),
                    "compute_capability": f"{props.major}.{props.minor}",
                    "bf16": props.major >= 8,  # Ampere and newer run bf16 natively
                }
            )
    return {
        "cpu_model": model,
        "cpu_physical_cores": psutil.cpu_count(logical=False),
        "cpu_logical_cores": psutil.cpu_count(logical=True),
        "ram_gib": round(psutil.virtual_memory().total / 1024**3, 1),
        "cpu_bf16_native": (len(bf16_flags) > 0) if flags else None,
        "cpu_bf16_flags": bf16_flags,
        "gpus": gpus,
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "distributed_backends": {
            "gloo": dist.is_available() and dist.is_gloo_available(),
            "nccl": dist.is_available() and dist.is_nccl_available(),
            "mpi": dist.is_available() and dist.is_mpi_available(),
        },
        "platform": f"{platform.system()} {platform.machine()}, Python {platform.python_version()}",
    }


def format_hardware_report(report: dict[str, Any]) -> str:
    """Render :func:`hardware_report` as aligned lines for printing in a notebook."""
    native = report["cpu_bf16_native"]
    cpu_bf16 = (
        "unknown (no CPU flags readable)"
        if native is None
        else f"native ({', '.join(report['cpu_bf16_flags'])})"
        if native
        else "emulated (works, slowly: no AVX512-BF16/AMX)"
    )
    if report["gpus"]:
        gpu_lines = [
            f"{g['index']}: {g['name']}, {g['memory_gib']} GiB, "
            f"sm {g['compute_capability']}, bf16 {'yes' if g['bf16'] else 'no'}"
            for g in report["gpus"]
        ]
    else:
        gpu_lines = ["none (multi-rank runs use gloo on CPU)"]
    backends = ", ".join(
        f"{k} {'yes' if v else 'no'}" for k, v in report["distributed_backends"].items()
    )
    rows = [
        ("CPU", report["cpu_model"]),
        (
            "cores",
            f"{report['cpu_physical_cores']} physical, {report['cpu_logical_cores']} logical",
        ),
        ("RAM", f"{report['ram_gib']} GiB"),
        ("bf16 on CPU", cpu_bf16),
        ("GPUs", gpu_lines[0]),
        *[("", line) for line in gpu_lines[1:]],
        ("torch", report["torch_version"]),
        ("CUDA", report["cuda_version"] or "none (CPU build)"),
        ("backends", backends),
        ("platform", report["platform"]),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
