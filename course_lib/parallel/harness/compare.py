"""Comparing a parallel run with one process, tensor by tensor (``parity.py`` runs them).

Tolerance. The parallel run adds the same numbers in another order (per-shard sums then an
all-reduce, split matmuls). float32 addition is not associative: a sum of n terms is off by up
to about (n-1)·eps·Σ|x_i| (Higham, "Accuracy and Stability of Numerical Algorithms", 2nd ed.,
§4.2), eps = 2^-23 ≈ 1.2e-7, relative differences around 1e-6 for the course's models. A tensor
(or a loss) passes when

    max |parallel - reference| <= atol + rtol · max |reference|        (rtol 1e-5, atol 1e-6)

a scale per tensor, not per element: an element that is a near-cancelling sum has a large
relative error and no meaning of its own. In tests/parallel/test_harness.py correct wrappers stay
below 2% of the tolerance; the planted bugs (summed instead of averaged gradients, a rank that
keeps its local gradient) exceed it 4·10^4 to 2·10^5 times at their first wrong gradient.
Override ``rtol``/``atol`` for lower precisions (bfloat16 needs about 1e-2).

Adam in float32. Adam's step for one element is about lr·g/(|g| + eps_adam), with slope
lr/eps_adam at g = 0 (1e6 for lr 1e-2, eps_adam 1e-8): the rounding noise of a nearly-zero
gradient becomes a visible step in a random direction. Attention has such gradients: the key
bias's is exactly zero in exact arithmetic (softmax ignores a shift shared by a row). Measured on
the tiny GPT under DDP on 4 ranks with AdamW lr 1e-2: parameters differ by up to 1e-4 after one
step (57 times the tolerance) while every gradient of that step matches; with SGD the same run
stays at 2%. So check Adam-based wrappers in float64 (``model_fn`` returns ``model.double()``,
float64 inputs): the noise is 2^29 times smaller and the same run stays at 1e-6 of the tolerance.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import pandas as pd
import torch

from course_lib import validate

__all__ = ["Record", "compare", "assert_parity", "RTOL", "ATOL", "COLUMNS"]

RTOL = 1e-5  #: default relative tolerance, times max |reference| of each tensor
ATOL = 1e-6  #: default absolute tolerance


@dataclass
class Record:
    """What one run did, in the names and shapes of the plain (unwrapped) model."""

    losses: list[float] = field(default_factory=list)
    """``losses[k]``: the global-batch loss of step k+1"""
    grads: list[dict[str, torch.Tensor]] = field(default_factory=list)
    """``grads[k]``: the gradients step k+1 applied, by parameter name"""
    params: list[dict[str, torch.Tensor]] = field(default_factory=list)
    """``params[0]``: before training; ``params[k]``: after step k"""


# ---- comparing -----------------------------------------------------------------------------
COLUMNS = ["rank", "step", "quantity", "name", "max_abs_diff", "tolerance", "ok", "problem"]
Quantity = Literal["param", "grad", "loss", "steps"]
Row = dict[str, Any]  #: one row of the table, keys COLUMNS


def compare(
    reference: Record,
    parallel: Record | Sequence[Record],
    *,
    rtol: float = RTOL,
    atol: float = ATOL,
) -> pd.DataFrame:
    """One row per step, rank and compared tensor (the columns of ``COLUMNS``), in the order
    things happen: parameters at step 0 (before training: did every process build the same
    model?), then for each step and rank the loss, the gradients and the updated parameters.
    ``parallel`` is one Record or the list ``launch`` returns (row ``rank`` = its index)."""
    rtol = validate.number("rtol", rtol, minimum=0)
    atol = validate.number("atol", atol, minimum=0)
    records = [parallel] if isinstance(parallel, Record) else list(parallel)
    for r in [reference, *records]:
        if not isinstance(r, Record):
            raise TypeError(f"record = {validate.describe(r)}: expected a harness.Record")
    rows: list[Row] = []
    for rank, rec in enumerate(records):
        if len(rec.losses) != len(reference.losses):
            problem = f"{len(rec.losses)} steps run, reference ran {len(reference.losses)}"
            rows.append(_row(rank, 0, "steps", "", math.inf, 0.0, problem))
            continue
        rows += _record_rows(rank, reference, rec, rtol, atol)
    rows.sort(key=lambda row: row["step"])  # stable: ranks stay in order within a step
    return pd.DataFrame(rows, columns=COLUMNS)


def assert_parity(
    reference: Record,
    parallel: Record | Sequence[Record],
    *,
    rtol: float = RTOL,
    atol: float = ATOL,
) -> pd.DataFrame:
    """:func:`compare`, raising ``AssertionError`` at the first mismatch (rank, step, tensor,
    max abs diff, tolerance); returns the table when everything matches."""
    table = compare(reference, parallel, rtol=rtol, atol=atol)
    bad = table[~table["ok"]]
    if len(bad):
        first = bad.iloc[0]
        what = first.quantity + (f" {first['name']!r}" if first["name"] else "")
        raise AssertionError(
            f"parity fails at rank {first['rank']}, step {first.step}, {what}: "
            f"{first.problem}; {len(bad)} of {len(table)} comparisons fail"
        )
    return table


def _record_rows(rank: int, reference: Record, rec: Record, rtol: float, atol: float) -> list[Row]:
    """The rows of one rank's record: parameters at step 0, then per step loss, gradients and
    updated parameters."""
    rows = _tensor_rows(rank, 0, "param", reference.params[0], rec.params[0], rtol, atol)
    f64 = torch.float64
    for k in range(len(reference.losses)):
        ref_loss = torch.tensor(reference.losses[k], dtype=f64)
        got_loss = torch.tensor(rec.losses[k], dtype=f64)
        rows.append(_check(rank, k + 1, "loss", "", ref_loss, got_loss, rtol, atol))
        rows += _tensor_rows(rank, k + 1, "grad", reference.grads[k], rec.grads[k], rtol, atol)
        rows += _tensor_rows(
            rank, k + 1, "param", reference.params[k + 1], rec.params[k + 1], rtol, atol
        )
    return rows


def _tensor_rows(
    rank: int,
    step: int,
    quantity: Quantity,
    ref: dict[str, torch.Tensor],
    got: dict[str, torch.Tensor],
    rtol: float,
    atol: float,
) -> list[Row]:
    rows = [
        _check(rank, step, quantity, name, t, got.get(name), rtol, atol) for name, t in ref.items()
    ]
    rows += [
        _row(rank, step, quantity, name, math.inf, 0.0, "not in the reference run")
        for name in got
        if name not in ref
    ]
    return rows


def _check(
    rank: int,
    step: int,
    quantity: Quantity,
    name: str,
    ref: torch.Tensor,
    got: torch.Tensor | None,
    rtol: float,
    atol: float,
) -> Row:
    if got is None:
        return _row(rank, step, quantity, name, math.inf, 0.0, "missing from the parallel run")
    if got.shape != ref.shape:
        problem = f"shape {tuple(got.shape)} != reference {tuple(ref.shape)}"
        return _row(rank, step, quantity, name, math.inf, 0.0, problem)
    ref64, got64 = ref.double(), got.double()
    diff = float((got64 - ref64).abs().max()) if ref.numel() else 0.0
    scale = float(ref64.abs().max()) if ref.numel() else 0.0
    tol = atol + rtol * scale
    problem = (
        ""
        if diff <= tol
        else (
            f"max abs diff {diff:.3g} > tolerance {tol:.3g} "
            f"(atol {atol:g} + rtol {rtol:g} × max|reference| {scale:.3g})"
        )
    )
    return _row(rank, step, quantity, name, diff, tol, problem)


def _row(
    rank: int, step: int, quantity: Quantity, name: str, diff: float, tol: float, problem: str
) -> Row:
    return dict(
        rank=rank,
        step=step,
        quantity=quantity,
        name=name,
        max_abs_diff=diff,
        tolerance=tol,
        ok=not problem,
        problem=problem,
    )
