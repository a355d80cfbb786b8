"""Offload: which state leaves the device, what it costs in traffic, and the step-time model.

Introduced in notebooks/05_cpu_offload.ipynb.

Offload keeps part of the model state in host memory (ZeRO-Offload, Ren et al. 2021,
arXiv:2101.06840) or on NVMe (ZeRO-Infinity, Rajbhandari et al. 2021, arXiv:2104.07857) and moves
it over PCIe each step. The byte counts come from :func:`model_state_bytes` (params P, grads G,
fp32 master M, optimizer state O); the levels of :data:`OFFLOAD_LEVELS` say which of them live
where. Times are seconds, bandwidths GB/s (1e9 bytes/s).
"""

from __future__ import annotations

from typing import Literal

from course_lib import validate as _v
from course_lib.measure.estimate.memory import OPTIMIZERS, Optimizer, model_state_bytes

__all__ = [
    "OffloadLevel",
    "OFFLOAD_LEVELS",
    "OffloadPrecision",
    "OFFLOAD_PRECISIONS",
    "offload_split",
    "transfer_time",
    "offload_transfer_times",
    "HOST_ADAM_BYTES_PER_PARAM",
    "host_adam_time",
    "nvme_traffic_bytes",
    "offload_step_time",
    "NVME_GBPS",
]

#: what each level keeps off the device, from least to most offloaded:
#:
#: * ``none``: everything on the device;
#: * ``optimizer``: fp32 master weights and optimizer state on the host, updated there; the
#:   gradients accumulate on the device and go down once per step (an optimizer-only offload,
#:   the course's ``OffloadAdamW``; not ZeRO-Offload, which moves the gradients too);
#: * ``optimizer+grads``: the gradients too, streamed to the host as backward produces them:
#:   ZeRO-Offload (Ren et al. 2021: fp16 params on the device, 2 B/param, 14 on the host, the
#:   paper's 8x; DeepSpeed ``"offload_optimizer": {"device": "cpu"}``). With gradient
#:   accumulation they cross every micro-step, not once per step; the bucket is not counted;
#: * ``all``: the 16-bit parameters too, fetched layer by layer for forward and again for
#:   backward (DeepSpeed ``"offload_param"`` with ZeRO-3, FSDP2 ``CPUOffloadPolicy``); the
#:   layer being computed is not counted.
OffloadLevel = Literal["none", "optimizer", "optimizer+grads", "all"]
OFFLOAD_LEVELS: tuple[OffloadLevel, ...] = ("none", "optimizer", "optimizer+grads", "all")
#: precisions the offload formulas accept (a host update needs an fp32 copy of the weights)
OffloadPrecision = Literal["fp32", "bf16-mixed", "fp16-mixed"]
OFFLOAD_PRECISIONS: tuple[OffloadPrecision, ...] = ("fp32", "bf16-mixed", "fp16-mixed")


def offload_split(
    n_params: int,
    *,
    level: OffloadLevel = "optimizer",
    precision: OffloadPrecision = "bf16-mixed",
    optimizer: Optimizer = "adam",
) -> dict[str, int]:
    """Bytes on the device, bytes on the host and bytes moved each way per step, for one level
    of :data:`OFFLOAD_LEVELS`.

    From :func:`model_state_bytes` (P params, G grads, M master, O optimizer state):

    ==================  ===========  ==================  ==========  ==========
    level               device       host                to host     to device
    ==================  ===========  ==================  ==========  ==========
    ``none``            P + G + M+O  0                   0           0
    ``optimizer``       P + G        W + O               G           P
    ``optimizer+grads`` P            W + O + G           G           P
    ``all``             0            W + O + G + P       G           2 P
    ==================  ===========  ==================  ==========  ==========

    W is the fp32 copy the host updates: the master weights M in mixed precision, a 4-byte copy
    of the weights in fp32 training (the device keeps its own). Gradients go down once per step
    and updated parameters come up once; with ``all`` every parameter is fetched for forward and
    again for backward (ZeRO-3 frees it in between). Activations and the buffers of the
    transfers are not counted.

    bf16-mixed Adam per parameter: ``none`` 16 / 0, ``optimizer`` 4 / 12 (to host 2, to device
    2), ``optimizer+grads`` 2 / 14, ``all`` 0 / 16 (to device 4). A 7B model with ``optimizer``
    keeps 84 GB on the host and moves 14 GB each way per step. ``to_host`` is per step with the
    gradients accumulated on the device; with ``optimizer+grads`` and K micro-batches it is
    K times ``G`` (the gradients leave after every backward).
    """
    n = _v.count("n_params", n_params)
    lvl = _v.choice("level", level, OFFLOAD_LEVELS, case_insensitive=True)
    prec = _v.choice("precision", precision, OFFLOAD_PRECISIONS, case_insensitive=True)
    opt = _v.choice("optimizer", optimizer, OPTIMIZERS, case_insensitive=True)
    s = model_state_bytes(n, precision=prec, optimizer=opt)
    p, g, o = s["params"], s["grads"], s["optimizer"]
    w = 4 * n  # the fp32 weights the host updates: the master copy, or a copy of fp32 weights
    if lvl == "none":
        return {"device": s["total"], "host": 0, "to_host": 0, "to_device": 0}
    if lvl == "optimizer":
        return {"device": p + g, "host": w + o, "to_host": g, "to_device": p}
    if lvl == "optimizer+grads":
        return {"device": p, "host": w + o + g, "to_host": g, "to_device": p}
    return {"device": 0, "host": w + o + g + p, "to_host": g, "to_device": 2 * p}


def transfer_time(nbytes: float, GBps: float) -> float:
    """Seconds to move ``nbytes`` at ``GBps`` (1e9 bytes/s): bytes / bandwidth, no latency term
    (per-transfer latency, microseconds, is negligible beside gigabytes)."""
    return _v.number("nbytes", nbytes, minimum=0) / (_v.number("GBps", GBps, positive=True) * 1e9)


def offload_transfer_times(
    n_params: int,
    *,
    level: OffloadLevel = "optimizer",
    precision: OffloadPrecision = "bf16-mixed",
    optimizer: Optimizer = "adam",
    link_GBps: float = 32.0,
) -> dict[str, float]:
    """Seconds per step on a host link of ``link_GBps`` per direction (default 32: PCIe 4.0 x16,
    ``link_speed("PCIe 4.0 x16")``): ``to_host_s`` and ``to_device_s`` (each direction alone),
    ``duplex_s`` = the larger one (PCIe carries both directions at once) and ``serial_s`` = their
    sum (one after the other: a synchronous step, the params cannot go up before the host update).

    7B, bf16-mixed, ``optimizer``: 14 GB each way, 0.4375 s each at 32 GB/s; 0.875 s serial.
    """
    split = offload_split(n_params, level=level, precision=precision, optimizer=optimizer)
    down = transfer_time(split["to_host"], link_GBps)
    up = transfer_time(split["to_device"], link_GBps)
    return {"to_host_s": down, "to_device_s": up, "duplex_s": max(down, up), "serial_s": down + up}


#: bytes of host memory traffic per parameter of one fp32 AdamW update on the host: read the
#: master weight, m, v and the fp32 gradient (16), write master, m and v (12). Adam is
#: elementwise: a handful of FLOPs per 28 bytes, so it runs at memory bandwidth.
HOST_ADAM_BYTES_PER_PARAM = 28


def host_adam_time(
    n_params: int, *, host_GBps: float, bytes_per_param: float = HOST_ADAM_BYTES_PER_PARAM
) -> float:
    """Seconds of one Adam update of ``n_params`` on the host, memory-bound:
    n * ``bytes_per_param`` / ``host_GBps``. ``host_GBps`` is the bandwidth the update reaches
    (measure it: a small update's bytes / its time); a server socket's DRAM peaks at a few hundred
    GB/s, and one thread reaches a fraction of it."""
    n = _v.count("n_params", n_params)
    b = _v.number("bytes_per_param", bytes_per_param, positive=True)
    return transfer_time(n * b, host_GBps)


#: sequential bandwidths of one NVMe SSD in GB/s (vendor data sheets; Samsung 990 PRO, PCIe 4.0
#: x4: 7.45 read, 6.9 write). ZeRO-Infinity stripes over several drives to add them up.
NVME_GBPS = {"read": 7.45, "write": 6.9}


def nvme_traffic_bytes(
    n_params: int, *, precision: OffloadPrecision = "bf16-mixed", optimizer: Optimizer = "adam"
) -> dict[str, int]:
    """Bytes read from and written to NVMe per step when the optimizer state and the fp32 master
    live there (ZeRO-Infinity's NVMe tier, Rajbhandari et al. 2021, arXiv:2104.07857): every
    byte is read before the update and written after it, ``{"read": W + O, "write": W + O}``
    (the ``host`` bytes of level ``optimizer``). 7B bf16-mixed Adam: 84 GB each way."""
    host = offload_split(n_params, level="optimizer", precision=precision, optimizer=optimizer)[
        "host"
    ]
    return {"read": host, "write": host}


def offload_step_time(
    *,
    compute_s: float,
    transfer_s: float,
    host_s: float,
    storage_s: float = 0.0,
    overlap: bool = True,
) -> float:
    """Seconds per offloaded step from its parts: forward + backward on the device
    (``compute_s``), host link traffic (``transfer_s``), the host optimizer update (``host_s``)
    and, with an NVMe tier, its reads and writes (``storage_s``).

    ``overlap=True``: the parts run at the same time and the slowest sets the pace,
    max(compute, transfer, host, storage) -- a lower bound, reached by ZeRO-Offload's
    one-step-delayed parameter update (Ren et al. 2021, Sec. 5.2). ``overlap=False``: one after
    the other, their sum -- what a synchronous step (``techniques.offload.OffloadAdamW``) takes.
    """
    parts = [
        _v.number(name, value, minimum=0)
        for name, value in (
            ("compute_s", compute_s),
            ("transfer_s", transfer_s),
            ("host_s", host_s),
            ("storage_s", storage_s),
        )
    ]
    if not isinstance(overlap, bool):
        raise TypeError(f"overlap = {overlap!r}: expected True or False")
    return max(parts) if overlap else sum(parts)
