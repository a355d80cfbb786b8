"""What a 3-D run (:func:`course_lib.plan.three_d.run_3d`) is read with: its parity with one
process on the full batch, each rank's measured model state beside the planner's prediction,
and what each rank sent. Re-exported by ``three_d``.
Introduced in notebooks/14_planning_a_run.ipynb."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypedDict

import torch

from course_lib import validate as _v
from course_lib.plan.specs import Layout
from course_lib.plan.three_d_result import RankRun3D, Run3D

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["parity_3d", "Parity3D", "memory_table", "comm_table", "LOSS_RTOL", "PARAM_TOL"]

#: parity tolerances. Loss: |diff| <= LOSS_RTOL × |reference loss| (fp32 sums in another
#: order). Parameters after Adam: |diff| <= PARAM_TOL × lr × steps. Adam moves a parameter by
#: about lr per step whatever the size of its gradient (g / sqrt(v)), so a last-bit difference
#: in a tiny gradient shows up at the scale of lr; we allow 1% of the largest possible movement.
LOSS_RTOL = 1e-5
PARAM_TOL = 1e-2


class Parity3D(TypedDict):
    """What :func:`parity_3d` found: ``ok``, both loss curves, the largest differences (and the
    parameter that has it), the tolerances, and the parameters present in only one of the two."""

    ok: bool
    reference_losses: list[float]
    losses: list[float]
    max_loss_diff: float
    max_param_diff: float
    worst_param: str | None
    param_tolerance: float
    replica_param_diff: float
    missing: list[str]
    loss_rtol: float
    param_tol: float


def _check_run(result: Any) -> Run3D:
    if not isinstance(result, Run3D):
        raise TypeError(
            f"result = {_v.describe(result)}: expected the Run3D that three_d.run_3d (or "
            "plan.run_layout) returned; a results file's dict: three_d.Run3D.from_dict(value)"
        )
    return result


def _replica_diff(ranks: Sequence[RankRun3D]) -> float:
    """Largest difference between the parameters of two dp replicas of the same stage (0.0
    when the gradient all-reduce keeps them bit-identical)."""
    replicas: dict[int, dict[str, torch.Tensor]] = {}  # stage -> the first replica's parameters
    diff = 0.0
    for r in ranks:
        if r.params is None:
            continue
        stage, params = r.coords[0], r.params
        if stage in replicas:
            diff = max(
                diff,
                max((params[k] - replicas[stage][k]).abs().max().item() for k in params),
            )
        else:
            replicas[stage] = dict(params)
    return diff


def parity_3d(
    result: Run3D,
    reference: dict[str, Any] | None = None,
    *,
    loss_rtol: float = LOSS_RTOL,
    param_tol: float = PARAM_TOL,
) -> Parity3D:
    """Compare a :func:`run_3d` result with one process on the full batch (:func:`reference_3d`
    with the same settings): the loss of every step (|diff| <= loss_rtol × |loss|) and every
    parameter after training (|diff| <= param_tol × lr × steps, see :data:`PARAM_TOL`). Also
    checks that the dp replicas hold bit-identical parameters. Returns the largest differences
    and ``ok``."""
    result = _check_run(result)
    from course_lib.plan.three_d_reference import reference_3d

    ref = reference or reference_3d(
        steps=result.steps,
        batch=result.batch,
        lr=result.lr,
        seed=result.seed,
        config=result.config,
    )
    loss_diff = max(abs(a - b) for a, b in zip(ref["losses"], result.losses))
    loss_ok = all(abs(a - b) <= loss_rtol * abs(a) for a, b in zip(ref["losses"], result.losses))
    missing = sorted(set(ref["params"]) ^ set(result.params))
    param_atol = param_tol * result.lr * result.steps
    worst, worst_name = 0.0, None
    for name, want in ref["params"].items():
        got = result.params.get(name)
        if got is None or got.shape != want.shape:
            missing.append(name)
            continue
        diff = (got - want).abs().max().item()
        if diff >= worst:
            worst, worst_name = diff, name
    replica_diff = _replica_diff(result.ranks)
    ok = loss_ok and not missing and worst <= param_atol and replica_diff == 0.0
    return {
        "ok": ok,
        "reference_losses": ref["losses"],
        "losses": list(result.losses),
        "max_loss_diff": loss_diff,
        "max_param_diff": worst,
        "worst_param": worst_name,
        "param_tolerance": param_atol,
        "replica_param_diff": replica_diff,
        "missing": missing,
        "loss_rtol": loss_rtol,
        "param_tol": param_tol,
    }


#: bytes per element the planner assumes (bf16 weights and grads, fp32 master + Adam moments)
#: and what the fp32 run on CPU holds (fp32 weights and grads, Adam's two moments)
_PLANNER_BYTES = {"params": 2, "grads": 2, "optimizer": 12}
_RUN_BYTES = {"params": 4, "grads": 4, "optimizer": 8}


def memory_table(result: Run3D) -> pd.DataFrame:
    """Measured vs predicted model state per rank (one row per pipeline stage, tp rank 0 of dp
    replica 0; the other ranks of a stage measure the same). ``predict_memory`` counts
    mixed-precision bytes (2 + 2 + 12 per parameter); the run is fp32 with Adam (4 + 4 + 8), so
    both are also shown in elements: bytes / bytes per element. ``measured_optimizer`` includes
    Adam's scalar ``step`` counters (4 bytes per tensor)."""
    import pandas as pd

    from course_lib.plan.memory import predict_memory
    from course_lib.plan.three_d_reference import tiny_spec

    result = _check_run(result)
    dims = result.dims
    spec = tiny_spec(result.config)
    layout = Layout(
        dp=dims.dp, tp=dims.tp, pp=dims.pp, zero=0, recompute="none", sequence_parallel=False
    )
    rows = []
    for r in result.ranks:
        pp_rank, dp_rank, tp_rank = r.coords
        if dp_rank or tp_rank:
            continue
        which = "first" if pp_rank == 0 else "last"
        pred = predict_memory(spec, layout, stage=which if dims.pp > 1 else "worst")
        row: dict[str, int | float] = {"rank": r.rank, "stage": pp_rank}
        for cat in ("params", "grads", "optimizer"):
            row[f"measured_{cat}"] = r.memory[cat]
            row[f"predicted_{cat}"] = pred[cat]
        # MemoryMeter counts module buffers (causal masks, positions) as params: taken out
        row["measured_params_elems"] = (r.memory["params"] - r.buffer_bytes) // _RUN_BYTES["params"]
        row["predicted_params_elems"] = math.ceil(pred["params"] / _PLANNER_BYTES["params"])
        row["elems_ratio"] = row["measured_params_elems"] / row["predicted_params_elems"]
        rows.append(row)
    return pd.DataFrame(rows)


_COMM_COLUMNS = ["rank", "pp", "dp", "tp", "all_reduce", "send", "recv"]
_COMM_COLUMNS += ["p2p_bytes_sent", "model_bytes_sent", "wire_bytes_sent"]


def comm_table(result: Run3D) -> pd.DataFrame:
    """What each rank sent during training (CommMeter): calls, the pipeline's point-to-point
    payload, the modelled bytes of all calls and the bytes the OS saw it write (gloo over TCP;
    None where unavailable). The traffic columns of ``result.to_frame()``."""
    return _check_run(result).to_frame()[_COMM_COLUMNS]
