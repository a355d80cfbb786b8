"""Unit 11's check pieces shared by its tasks: the course's answers the ranks keep out of
reach, the launch, and the comparison of every rank's tensors with one process's."""

from __future__ import annotations

from typing import Any

from course_lib.grading.core import error_pair, fail, launch_learner
from course_lib.grading.plain import describe

#: the course's answers, out of reach while the learner's code runs in the ranks
REFERENCES = (
    "course_lib.parallel.tensor.layers:RowParallelLinear",
    "course_lib.parallel.tensor.layers:ColumnParallelLinear",
    "course_lib.parallel.tensor.comms:ReduceFromTensorParallelRegion",
    "course_lib.parallel.tensor.comms:CopyToTensorParallelRegion",
    "course_lib.parallel.tensor.comms:ReduceScatterToSequenceRegion",
)
UNIT = "u11_tensor_parallelism"
GRADE_TIMEOUT_S = 60.0
RTOL, ATOL = 1e-5, 1e-6  # float32, per tensor: ATOL + RTOL x max|reference| (parallel.harness)


def _launch(task: int, worker, world_size: int, *args) -> list[dict]:
    return launch_learner(task, worker, world_size, *args, timeout=GRADE_TIMEOUT_S)


def _collect_on_ranks(task: int, fn: Any, worker: Any, case: dict) -> dict:
    """The learner's side of tasks 1 and 3: ``worker`` runs ``fn`` on ``case`` in 2 and 4 ranks
    (the course's answers out of reach); what each rank handed back under "got", by world
    size."""
    if not callable(fn):
        fail(task, f"expected a function, got {type(fn).__name__} {fn!r}")
    return {
        world_size: [
            r.get("got") for r in _launch(task, worker, world_size, fn, list(REFERENCES), case)
        ]
        for world_size in (2, 4)
    }


def _worst(got, ref) -> float:
    """max |got - ref| / (ATOL + RTOL max|ref|); inf when a shape differs or got is missing."""
    if got is None or tuple(got.shape) != tuple(ref.shape):
        return float("inf")
    return float((got.double() - ref.double()).abs().max()) / (
        ATOL + RTOL * float(ref.double().abs().max())
    )


def _compare(
    task: int, got_ranks: Any, ref_ranks: list[dict], world_size: str, hints: dict[str, str]
) -> None:
    """Every rank's tensors (``got_ranks``: one dict per rank, as the ranks handed them back)
    against one process's (``ref_ranks``), in the order of ``ref_ranks``' names."""
    import torch

    if not isinstance(got_ranks, list) or len(got_ranks) != len(ref_ranks):
        fail(task, f"the run on {world_size} handed back no results of its ranks")
    for rank, (got_all, refs) in enumerate(zip(got_ranks, ref_ranks)):
        for name, ref in refs.items():
            got = got_all.get(name) if isinstance(got_all, dict) else None
            if got is not None and not isinstance(got, torch.Tensor):
                fail(task, f"rank {rank} of {world_size}: {name} is {describe(got)}, not a tensor")
            if got is not None and tuple(got.shape) != tuple(ref.shape):
                fail(
                    task,
                    f"rank {rank} of {world_size}: {name} has shape {tuple(got.shape)}, "
                    f"expected {tuple(ref.shape)}",
                )
            if got is None:
                fail(task, f"rank {rank} of {world_size}: {name} is None; {hints[name]}")
            worst = _worst(got, ref)
            if not worst <= 1.0:
                fail(
                    task,
                    f"rank {rank} of {world_size}: {name} differs from one process "
                    f"({worst:.3g} x the tolerance); {hints[name]}",
                )


def _detached(t: Any) -> Any:
    return None if t is None else t.detach().clone()


def _learner_backward(
    fn: Any, forbid: Any, args: tuple, call: str, target: Any, leaves: tuple, names: tuple
) -> dict:
    """In a rank: ``fn(*args)`` with the course's answers out of reach, then the loss
    ``(y * target).sum()`` backward; what crosses: the answers the learner's code reached for,
    and its output and the gradients of ``leaves`` by ``names`` (or the error it raised)."""
    import torch

    from course_lib.grading.references import watch_references

    used: list[str] = []
    try:
        with watch_references(forbid) as used:
            y = fn(*args)
            if not isinstance(y, torch.Tensor):
                raise TypeError(f"{call} = a {type(y).__name__}: expected a tensor")
            (y * target).sum().backward()
    except Exception as exc:  # noqa: BLE001 - reported in the verdict
        return {"used": list(used), "error": error_pair(exc)}
    got = (y, *(t.grad for t in leaves))
    return {"used": list(used), "got": dict(zip(names, map(_detached, got)))}
