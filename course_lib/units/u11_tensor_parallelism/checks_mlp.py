"""Unit 11's task 3 (solutions/11_tensor_parallelism.ipynb): the tensor-parallel MLP whose
all-reduces were on the wrong side, fixed. Re-exported by :mod:`checks`.

``collect_fixed_mlp`` runs the learner's MLP on 2 and 4 real ranks, each with its shards of a
drawn MLP, and hands back its output and gradients; ``judge_fixed_mlp`` runs one process's MLP
from the same seed and compares every rank's tensors with it.
"""

from __future__ import annotations

from typing import Any

from course_lib.grading.core import passed
from course_lib.grading.seeds import case_rng
from course_lib.grading.split import split_check
from course_lib.units.u11_tensor_parallelism.checks_common import (
    UNIT,
    _collect_on_ranks,
    _compare,
    _learner_backward,
)

__all__ = ["check_fixed_mlp", "mlp_case"]


def mlp_case(task: int) -> dict:
    """Task 3's MLP: width, batch shape (rows, seq) and seed."""
    rng = case_rng(task, UNIT)
    return {
        "width": rng.choice((4, 6, 8, 12)),
        "shape": (rng.randint(1, 3), rng.randint(2, 5)),
        "seed": rng.randrange(10_000),
    }


_MLP_NAMES = (
    "the output",
    "the input's gradient",
    "c_fc's weight gradient",
    "c_proj's weight gradient",
)


def _drawn_mlp(case: dict):
    """Task 3's drawn MLP (c_fc with a bias, c_proj without), input and the target of the loss
    ``(y * target).sum()``, from the case's seed (the same in every process)."""
    import torch

    width = case["width"]
    torch.manual_seed(case["seed"])
    fc, proj = torch.nn.Linear(width, 4 * width), torch.nn.Linear(4 * width, width, bias=False)
    x = torch.randn(*case["shape"], width)
    target = torch.randn(*case["shape"], width)
    return fc, proj, x, target


def _mlp_worker(rank: int, world_size: int, fn, forbid, case) -> dict:
    """The learner's tensor-parallel MLP on this rank's shards: its output and the gradients
    its backward gives the input and both weight shards."""
    import torch

    fc, proj, x, target = _drawn_mlp(case)
    width = case["width"]
    # this rank's shards: c_fc's output rows (column parallel), c_proj's input columns (row)
    my_fc = torch.nn.Linear(width, 4 * width // world_size)
    my_proj = torch.nn.Linear(4 * width // world_size, width, bias=False)
    with torch.no_grad():
        my_fc.weight.copy_(fc.weight.chunk(world_size, dim=0)[rank])
        my_fc.bias.copy_(fc.bias.chunk(world_size)[rank])
        my_proj.weight.copy_(proj.weight.chunk(world_size, dim=1)[rank])
    xl = x.clone().requires_grad_(True)
    return _learner_backward(
        fn,
        forbid,
        (xl, my_fc, my_proj, None),
        "fn(x, c_fc, c_proj, group)",
        target,
        (xl, my_fc.weight, my_proj.weight),
        _MLP_NAMES,
    )


def _mlp_references(case: dict, world_size: int) -> list[dict]:
    """What one process's MLP gives each rank: the whole output and input gradient, and the
    shards of both weight gradients."""
    import torch.nn.functional as F

    fc, proj, x, target = _drawn_mlp(case)
    xr = x.clone().requires_grad_(True)
    y = proj(F.gelu(fc(xr)))
    (y * target).sum().backward()
    fc_grad, proj_grad = fc.weight.grad, proj.weight.grad
    assert xr.grad is not None and fc_grad is not None and proj_grad is not None
    return [
        dict(
            zip(
                _MLP_NAMES,
                (
                    y.detach(),
                    xr.grad,
                    fc_grad.chunk(world_size, 0)[rank],
                    proj_grad.chunk(world_size, 1)[rank],
                ),
            )
        )
        for rank in range(world_size)
    ]


def collect_fixed_mlp(fn, task: int = 3) -> dict:
    """Task: ``fn(x, c_fc, c_proj, group)``, the tensor-parallel MLP (c_fc: this rank's
    column shard, c_proj: its row shard, no bias) with its communication on the right sides:
    the whole output on every rank, and the gradients of one process's MLP. Graded on 2 and 4
    ranks, width, batch and weights drawn."""
    return _collect_on_ranks(task, fn, _mlp_worker, mlp_case(task))


def judge_fixed_mlp(data: Any, task: int = 3) -> None:
    case = mlp_case(task)
    hint = (
        "the MLP's input is the same on every rank (copy in, sum the gradient in "
        "backward); its output is a partial sum (sum it in forward, copy the gradient)"
    )
    for world_size in (2, 4):
        _compare(
            task,
            data.get(world_size) if isinstance(data, dict) else None,
            _mlp_references(case, world_size),
            f"{world_size} (MLP of width {case['width']})",
            dict.fromkeys(_MLP_NAMES, hint),
        )
    passed(
        task,
        "the fixed MLP equals one process on 2 and 4 ranks: output, input gradient "
        "and both weight gradients",
    )


check_fixed_mlp = split_check(collect_fixed_mlp, judge_fixed_mlp)
