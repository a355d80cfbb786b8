"""The planner's assumed matmul efficiency replaced by a measured one.

``Assumptions.matmul_efficiency`` (60 % of peak) is the one number of the step-time model that is
neither hardware nor bytes. Two measurements a learner can make replace it:

* :func:`efficiency_from_gpu_check`: the bf16 matmul of ``make gpu-check`` (a dated report in
  ``docs/``, the row "bf16 matmul (TFLOP/s)", 8192^3) over the card's bf16 peak: what a large
  GEMM reaches on this card, an upper bound for a training step's products;
* :func:`fit_efficiency`: the efficiency at which the planner predicts a step time measured on a
  real run of a layout (a ``torchrun`` run's timing, or a published step): every other term of
  the model kept, the products' speed solved for.

Either gives ``Assumptions`` to pass to ``plan()``; unit 14 shows the ranking move.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from course_lib import validate as _v
from course_lib.plan.comm_model import DEFAULT_ASSUMPTIONS, Assumptions
from course_lib.plan.specs import ClusterSpec, Layout, ModelSpec

__all__ = ["efficiency_from_gpu_check", "fit_efficiency"]

_GPU_CHECK_ROW = re.compile(
    r"^\|\s*bf16 matmul \(TFLOP/s\)\s*\|\s*([0-9][0-9,]*\.?[0-9]*)\s*\|", re.M
)


def efficiency_from_gpu_check(report: str | Path, *, peak_flops: float) -> float:
    """The measured bf16 8192^3 matmul of a ``make gpu-check`` report (its path, or its text)
    over ``peak_flops`` (the card's dense bf16 peak, FLOP/s). The report's 2026-11-27 H100 run:
    752.9 TFLOP/s over 989 = 0.761. Raises ValueError naming the report when the row is
    missing, FileNotFoundError when a path (a Path, or one line ending .md) names no file."""
    peak = _v.number("peak_flops", peak_flops, positive=True, finite=True)
    text = str(report)
    where = "the report text"
    if "\n" not in text and Path(text).is_file():
        where, text = text, Path(text).read_text(encoding="utf-8")
    elif isinstance(report, Path) or ("\n" not in text and text.endswith(".md")):
        raise FileNotFoundError(
            f"report = {text!r}: expected the path of a gpu-check report (no such file from "
            f"{Path.cwd()}) or the report's text"
        )
    found = _GPU_CHECK_ROW.search(text)
    if found is None:
        raise ValueError(
            f"report = {where}: expected a row '| bf16 matmul (TFLOP/s) | N |' (make gpu-check "
            "writes it in its FP8 section)"
        )
    measured = float(found.group(1).replace(",", "")) * 1e12
    return _v.number("the measured matmul's share of peak_flops", measured / peak, maximum=1.0)


def fit_efficiency(
    model: ModelSpec,
    cluster: ClusterSpec,
    layout: Layout,
    *,
    global_batch_tokens: int,
    measured_step_s: float,
    assumptions: Assumptions = DEFAULT_ASSUMPTIONS,
    uneven_stages: bool = False,
) -> Assumptions:
    """``assumptions`` with the matmul efficiency at which ``step_time`` of ``layout`` equals
    ``measured_step_s`` (bisection: the predicted step falls as the efficiency grows). Raises
    ValueError when no efficiency in (0, 1] reaches the measurement: the step is faster than
    the model at 100 % of peak allows (a wrong peak or a wrong layout), or so slow that the
    products alone are not what is missing."""
    from course_lib.plan.planner import step_time

    target = _v.number("measured_step_s", measured_step_s, positive=True, finite=True)

    def predicted(eff: float) -> float:
        how = assumptions.replace(matmul_efficiency=eff)
        kw: dict[str, Any] = dict(
            global_batch_tokens=global_batch_tokens, assumptions=how, uneven_stages=uneven_stages
        )
        return float(step_time(model, cluster, layout, **kw)["step_s"])

    lo, hi = 0.01, 1.0
    fastest, slowest = predicted(hi), predicted(lo)
    if not fastest <= target <= slowest:
        raise ValueError(
            f"measured_step_s = {target:g}: expected between {fastest:.4g} s (every product at "
            f"peak) and {slowest:.4g} s (at 1 % of peak) for this layout"
        )
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if predicted(mid) > target else (lo, mid)
    return assumptions.replace(matmul_efficiency=round((lo + hi) / 2, 6))
