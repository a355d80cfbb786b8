"""ZeRO: model-state bytes per rank when data-parallel ranks shard optimizer state, gradients and
parameters (Rajbhandari et al. 2019, arXiv:1910.02054), and the padding that even shards cost.

Introduced in notebooks/10_zero_fsdp.ipynb."""

from __future__ import annotations

import numbers
from collections.abc import Iterable
from fractions import Fraction
from typing import Any

from course_lib import validate as _v
from course_lib.measure.estimate.units import exact

__all__ = [
    "zero_state_breakdown_per_rank",
    "zero_bytes_per_rank",
    "zero_padding",
    "zero_layout_bytes_per_rank",
    "ZERO_STAGES",
]


#: the ZeRO stages: 0 (plain data parallelism), 1 (P_os), 2 (P_os+g), 3 (P_os+g+p)
ZERO_STAGES = (0, 1, 2, 3)


def _zero_stage(stage: Any) -> int:
    return int(_v.choice("stage", _v.count("stage", stage), ZERO_STAGES))


def zero_state_breakdown_per_rank(
    n_params: int,
    *,
    stage: int,
    world_size: int,
    k: int = 12,
    param_bytes: int = 2,
    grad_bytes: int = 2,
) -> dict[str, int | float]:
    """Model-state bytes per rank under ZeRO, split into params / grads / optimizer (+ total).

    Accounting of the ZeRO paper (Rajbhandari et al. 2019, arXiv:1910.02054, Sec. 5 and
    Figure 1): fp16 params 2Ψ, fp16 grads 2Ψ, optimizer states KΨ (K = 12 for mixed-precision
    Adam: fp32 master, momentum, variance). Stage 0 is plain data parallelism (DDP, everything
    replicated); stage 1 (P_os) shards the optimizer states, stage 2 (P_os+g) also the gradients,
    stage 3 (P_os+g+p) also the parameters, over ``world_size`` = N_d ranks.
    ``param_bytes`` / ``grad_bytes`` (default 2, fp16/bf16) change the widths of the replicated
    parameters and gradients: plain fp32 training with AdamW is ``param_bytes=4, grad_bytes=4,
    k=8`` (no master copy), which is what notebooks/10_zero_fsdp.ipynb measures on CPU.

    Values are bytes: int when the shard divides evenly, else float.
    """
    n = _v.count("n_params", n_params)
    stage = _zero_stage(stage)
    nd = _v.count("world_size", world_size, minimum=1)
    k = _v.count("k", k)
    pb = _v.count("param_bytes", param_bytes, minimum=1)
    gb = _v.count("grad_bytes", grad_bytes, minimum=1)
    shard = Fraction(1, nd)
    params = Fraction(pb * n) * (shard if stage >= 3 else 1)
    grads = Fraction(gb * n) * (shard if stage >= 2 else 1)
    opt = Fraction(k * n) * (shard if stage >= 1 else 1)
    return {
        "params": exact(params),
        "grads": exact(grads),
        "optimizer": exact(opt),
        "total": exact(params + grads + opt),
    }


def zero_bytes_per_rank(
    n_params: int,
    *,
    stage: int,
    world_size: int,
    k: int = 12,
    param_bytes: int = 2,
    grad_bytes: int = 2,
) -> int | float:
    """Total model-state bytes per rank under ZeRO stage 0-3 (see
    :func:`zero_state_breakdown_per_rank`). Reproduces Figure 1 of arXiv:1910.02054:
    Ψ = 7.5e9, N_d = 64 gives 120, 31.4, 16.6 and 1.9 GB for stages 0-3.
    """
    return zero_state_breakdown_per_rank(
        n_params,
        stage=stage,
        world_size=world_size,
        k=k,
        param_bytes=param_bytes,
        grad_bytes=grad_bytes,
    )["total"]


def _unit_numels(units: Any) -> list[list[int]]:
    if isinstance(units, (str, bytes, numbers.Number)) or not isinstance(units, Iterable):
        raise TypeError(
            f"units = {_v.describe(units)}: expected a list of units, each a list of the "
            "element counts of its parameter tensors, e.g. [[256, 32], [64, 2]]"
        )
    out = []
    for i, unit in enumerate(units):
        if isinstance(unit, (str, bytes)) or not isinstance(unit, Iterable):
            unit = [unit]
        numels = [_v.count(f"units[{i}][{j}]", n) for j, n in enumerate(unit)]
        if not numels:
            raise ValueError(f"units[{i}] = []: expected at least one parameter tensor per unit")
        out.append(numels)
    return out


def zero_padding(units: Any, world_size: int) -> int:
    """Elements of zero padding when each unit (a list of parameter-tensor sizes, flattened end
    to end) is padded to a multiple of ``world_size`` so it cuts into equal shards:
    sum over units of ceil(Psi_u / N) * N - Psi_u (at most N-1 per unit). torch's FSDP2 pads
    each parameter tensor's dim 0 instead; DeepSpeed pads its flat buffers the same way.

    >>> zero_padding([[7], [10, 2]], 4)  # 7 -> 8, 12 -> 12
    1
    """
    nd = _v.count("world_size", world_size, minimum=1)
    return sum(-(-sum(u) // nd) * nd - sum(u) for u in _unit_numels(units))


def zero_layout_bytes_per_rank(
    units: Any,
    *,
    stage: int,
    world_size: int,
    param_bytes: int = 4,
    grad_bytes: int = 4,
    state_bytes: int = 8,
    step_bytes: int = 4,
) -> dict[str, int | float]:
    """Exact model-state bytes per rank of ``course_lib.parallel.zero.ZeroDataParallel`` after
    ``step()`` (before ``zero_grad``), with every unit padded (:func:`zero_padding`).

    ``units``: per unit (a module that owns parameters), the element counts of its parameter
    tensors. With s_u = ceil(Psi_u / N) the shard of unit u, P = sum_u N s_u the padded size:

    ========  ==================  ==============  ================  ===============
    stage     params              grads           optimizer         (per unit)
    ========  ==================  ==============  ================  ===============
    0         pb Psi              gb Psi          sb Psi + 4 T      T = tensors
    1         pb P                gb Psi          sb sum s_u + 4 U  U = units
    2         pb P                gb sum s_u      sb sum s_u + 4 U
    3         pb sum s_u          gb sum s_u      sb sum s_u + 4 U
    ========  ==================  ==============  ================  ===============

    pb/gb/sb: bytes per parameter, per gradient, of optimizer state per element (AdamW: m and v
    in fp32, 8); ``step_bytes``: torch.optim's scalar ``step`` tensor per optimized tensor (one per
    parameter tensor at stage 0, one per shard otherwise). Returns ``{"params", "grads",
    "optimizer", "total", "padding"}``; ``padding`` is the part of the total that is padding.
    Introduced in notebooks/10_zero_fsdp.ipynb.
    """
    stage = _zero_stage(stage)
    nd = _v.count("world_size", world_size, minimum=1)
    pb, gb = (
        _v.count("param_bytes", param_bytes, minimum=1),
        _v.count("grad_bytes", grad_bytes, minimum=1),
    )
    sb, tb = _v.count("state_bytes", state_bytes), _v.count("step_bytes", step_bytes)
    units = _unit_numels(units)
    psi = sum(map(sum, units))
    shards = sum(-(-sum(u) // nd) for u in units)  # sum of s_u

    def table(
        per_rank: int | Fraction, full: int
    ) -> tuple[int | Fraction, int | Fraction, int | Fraction]:
        # per_rank: a shard's elements; full: a full copy's elements
        if stage == 0:
            return pb * psi, gb * psi, sb * psi + tb * sum(map(len, units))
        return (
            pb * (per_rank if stage == 3 else full),
            gb * (per_rank if stage >= 2 else psi),
            sb * per_rank + tb * len(units),
        )

    params, grads, opt = (int(x) for x in table(shards, nd * shards))  # whole elements
    ideal = sum(table(Fraction(psi, nd), psi), Fraction(0))  # the same without padding
    out: dict[str, int | float] = {
        "params": params,
        "grads": grads,
        "optimizer": opt,
        "padding": exact(Fraction(params + grads + opt - ideal)),
    }
    out["total"] = params + grads + opt
    return {k: out[k] for k in ("params", "grads", "optimizer", "total", "padding")}
