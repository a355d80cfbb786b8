"""Backend/device choice and the hardware report."""

from __future__ import annotations

import sys

import cloudpickle
import pytest
import torch
import torch.distributed as dist

import course_lib
from course_lib.runtime.device import format_hardware_report, hardware_report, resolve_backend

cloudpickle.register_pickle_by_value(sys.modules[__name__])
N_GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0


def test_hardware_report_describes_this_machine():
    r = hardware_report()
    assert r["cpu_logical_cores"] >= r["cpu_physical_cores"] >= 1
    assert r["ram_gib"] > 0
    assert r["torch_version"] == torch.__version__
    assert r["cuda_version"] == torch.version.cuda
    assert r["distributed_backends"] == {
        "gloo": dist.is_gloo_available(),
        "nccl": dist.is_nccl_available(),
        "mpi": dist.is_mpi_available(),
    }
    assert len(r["gpus"]) == N_GPUS
    try:
        flags = next(
            line for line in open("/proc/cpuinfo") if line.startswith(("flags", "Features"))
        )
        native = any(f in flags.split() for f in ("avx512_bf16", "amx_bf16", "bf16"))
        assert r["cpu_bf16_native"] is native
    except (OSError, StopIteration):
        assert r["cpu_bf16_native"] is None


def test_format_hardware_report_has_one_line_per_fact():
    text = format_hardware_report(hardware_report())
    for label in ("CPU", "cores", "RAM", "bf16 on CPU", "GPUs", "torch", "CUDA", "backends"):
        assert any(line.startswith(label) for line in text.splitlines()), label
    assert "GiB" in text


def test_format_hardware_report_on_a_made_up_gpu_node():
    report = {
        **hardware_report(),
        "cpu_bf16_native": False,
        "cpu_bf16_flags": [],
        "gpus": [
            {
                "index": i,
                "name": "H100",
                "memory_gib": 79.6,
                "compute_capability": "9.0",
                "bf16": True,
            }
            for i in range(2)
        ],
    }
    text = format_hardware_report(report)
    assert "0: H100, 79.6 GiB, sm 9.0, bf16 yes" in text and "1: H100" in text
    assert "emulated" in text


def test_auto_backend_never_puts_two_nccl_ranks_on_one_gpu():
    assert resolve_backend("gloo", 8) == "gloo"
    expected = "nccl" if dist.is_nccl_available() and N_GPUS >= 2 else "gloo"
    assert resolve_backend("auto", 2) == expected
    assert resolve_backend("auto", N_GPUS + 1) == "gloo"


def test_rank_device_outside_a_launch_is_cpu():
    assert course_lib.rank_device() == torch.device("cpu")


def _device(rank, world_size):
    t = torch.ones(1, device=course_lib.rank_device())
    dist.all_reduce(t)
    return str(t.device), t.item(), dist.get_backend()


@pytest.mark.timeout(60)
def test_rank_device_under_gloo_is_cpu():
    assert course_lib.launch(_device, 2, backend="gloo") == [("cpu", 2.0, "gloo")] * 2


@pytest.mark.timeout(60)
@pytest.mark.skipif(N_GPUS < 1 or not dist.is_nccl_available(), reason="needs a CUDA GPU and NCCL")
def test_rank_device_under_nccl_is_one_gpu_per_rank():
    n = min(N_GPUS, 2)
    out = course_lib.launch(_device, n, backend="nccl")
    # NCCL for GPU tensors, gloo for CPU ones (runtime.device.group_backend)
    assert out == [(f"cuda:{r}", float(n), "cpu:gloo,cuda:nccl") for r in range(n)]
    assert (
        course_lib.launch(_device, n)[0][2] == "cpu:gloo,cuda:nccl"
    )  # auto: NCCL when GPUs suffice


def _cpu_and_gpu_tensors(rank, world_size):
    cpu = torch.full((2,), float(rank + 1))
    gpu = torch.full((2,), float(rank + 1), device=course_lib.rank_device())
    dist.all_reduce(cpu)
    dist.all_reduce(gpu)
    return cpu.tolist(), gpu.cpu().tolist(), gpu.device.type


@pytest.mark.timeout(60)
@pytest.mark.skipif(N_GPUS < 1 or not dist.is_nccl_available(), reason="needs a CUDA GPU and NCCL")
def test_under_nccl_a_collective_on_cpu_tensors_still_runs():
    n = min(N_GPUS, 2)
    total = float(n * (n + 1) // 2)
    out = course_lib.launch(_cpu_and_gpu_tensors, n, backend="nccl")
    assert out == [([total] * 2, [total] * 2, "cuda")] * n


def test_course_lib_backend_says_what_auto_means(monkeypatch):
    from course_lib.runtime.device import BACKEND_VARIABLE, resolve_backend

    monkeypatch.setenv(BACKEND_VARIABLE, "gloo")
    assert resolve_backend("auto", 2) == "gloo"
    assert resolve_backend("gloo", 2) == "gloo"
    monkeypatch.setenv(BACKEND_VARIABLE, "mpi")
    with pytest.raises(ValueError, match="COURSE_LIB_BACKEND = 'mpi': expected 'gloo' or 'nccl'"):
        resolve_backend("auto", 2)
    if not torch.cuda.is_available():  # nccl forced on a machine without GPUs: refused, named
        monkeypatch.setenv(BACKEND_VARIABLE, "nccl")
        with pytest.raises(ValueError, match="nccl"):
            resolve_backend("auto", 2)


def test_the_group_backend_under_nccl_also_carries_cpu_tensors():
    from course_lib.runtime.device import group_backend

    assert group_backend("nccl") == "cpu:gloo,cuda:nccl"
    assert group_backend("gloo") == "gloo"
