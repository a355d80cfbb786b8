"""A parity run's :class:`~course_lib.parallel.harness.Record` across the grading wall.

A rank of a check trains with the learner's code under :mod:`course_lib.parallel.harness` and
hands its Record back as plain data (:func:`plain_record`, on the learner's side); the judge
rebuilds it and trusts nothing in it (:func:`need_record`: losses, one gradient dict and one
parameter dict per step, the parameters before training first, or the ✗ verdict). Import-light:
the harness and torch are imported inside the functions.
"""

from __future__ import annotations

from typing import Any

__all__ = ["first_mismatch", "named_tensors", "need_record", "plain_record"]


def plain_record(record: Any) -> dict[str, Any]:
    """A ``harness.Record`` as plain data: its losses as floats, and its gradients and
    parameters, one dict of tensors by name per step."""
    return {
        "losses": [float(x) for x in record.losses],
        "grads": [dict(g) for g in record.grads],
        "params": [dict(p) for p in record.params],
    }


def named_tensors(value: Any, count: int) -> bool:
    """Whether ``value`` is a list of ``count`` dicts of tensors by (str) name."""
    import torch

    return (
        isinstance(value, list)
        and len(value) == count
        and all(
            isinstance(d, dict)
            and all(isinstance(k, str) and isinstance(t, torch.Tensor) for k, t in d.items())
            for d in value
        )
    )


def need_record(task: int, value: Any, where: str, *, steps: str = "its steps") -> Any:
    """The ``harness.Record`` that :func:`plain_record` made of a rank's run, rebuilt from
    ``value``; the ✗ verdict "<where>: the run handed back no record of <steps>" when it is not
    one (losses, one gradient and one parameter dict per step, the parameters before training
    first)."""
    from course_lib.grading.verdicts import fail
    from course_lib.parallel.harness import Record

    losses = value.get("losses") if isinstance(value, dict) else None
    if not (
        isinstance(value, dict)
        and isinstance(losses, list)
        and all(type(x) in (int, float) for x in losses)
        and named_tensors(value.get("grads"), len(losses))
        and named_tensors(value.get("params"), len(losses) + 1)
    ):
        fail(task, f"{where}: the run handed back no record of {steps}")
    return Record(
        losses=[float(x) for x in losses],
        grads=list(value["grads"]),
        params=list(value["params"]),
    )


def first_mismatch(task: int, table: Any, ranks: str, hint: str = "") -> None:
    """The ✗ verdict at the first row of ``harness.compare``'s ``table`` that fails, if any:
    "on <ranks>, step s, rank r: <quantity> <name> differs from one process on the full batch
    (<problem>)<hint>"."""
    from course_lib.grading.verdicts import fail

    bad = table[~table.ok]
    if len(bad):
        row = bad.iloc[0]
        fail(
            task,
            f"on {ranks}, step {row.step}, rank {row['rank']}: {row.quantity} "
            f"{row['name']!r} differs from one process on the full batch "
            f"({row.problem}){hint}",
        )
