"""Unit 11's graded checks (solutions/11_tensor_parallelism.ipynb, exercises/11_tensor_parallelism.ipynb).

1. ``check_row_parallel``: the learner's row-parallel Linear (local matmul, all-reduce in
   forward, nothing in backward, bias once), run on 2 and 4 real gloo ranks against one
   process's ``nn.Linear``: output, and the gradients of the input slice, the weight slice and
   the bias; the course's own RowParallelLinear / g / f are out of reach inside the ranks;
2. ``check_allreduce_count``: the learner's count of the all-reduces of one training step with
   gradient accumulation, for a depth and a number of micro-batches drawn from the grading
   seed, against a GPT of that depth split over 2 real ranks, counted by CommMeter;
3. ``check_fixed_mlp`` (``checks_mlp``): the tensor-parallel MLP whose all-reduces were on the
   wrong side, fixed: output and gradients equal one process's MLP on 2 and 4 ranks.
Shapes, seeds and sizes are drawn from the grading seed (``course_lib.grading.seeds``): another
seed asks about other ones. Each check is split (course_lib.grading.split): ``collect_X`` runs the
learner's code (in the ranks it launches) and hands back what it produced; ``judge_X`` computes
what is expected (one process's Linear and MLP from the drawn weights, the course's tensor-parallel
GPT on real ranks) and prints one deterministic line or raises AssertionError("✗ task N: ...").
"""

from __future__ import annotations

from typing import Any

from course_lib.grading.core import expect_int, fail, passed, run_learner
from course_lib.grading.plain import learner_number
from course_lib.grading.seeds import case_rng
from course_lib.grading.split import split_check
from course_lib.units.u11_tensor_parallelism.checks_common import (
    REFERENCES,
    UNIT,
    _collect_on_ranks,
    _compare,
    _launch,
    _learner_backward,
)
from course_lib.units.u11_tensor_parallelism.checks_mlp import (  # noqa: F401 (mlp_case: re-exported)
    check_fixed_mlp,
    mlp_case,
)

__all__ = [
    "check_row_parallel",
    "check_allreduce_count",
    "check_fixed_mlp",
    "REFERENCES",
    "COUNT_REFERENCES",
]


# --------------------------------------------------------------------------------------------
# task 1: the row-parallel Linear
# --------------------------------------------------------------------------------------------
def linear_case(task: int) -> dict:
    """Task 1's Linear: in features (a multiple of 4: 2 and 4 ranks), out features, rows, seed."""
    rng = case_rng(task, UNIT)
    return {
        "in": 4 * rng.randint(2, 5),
        "out": rng.randint(3, 9),
        "rows": rng.randint(2, 7),
        "seed": rng.randrange(10_000),
    }


def _drawn_linear(case: dict):
    """Task 1's drawn ``nn.Linear`` (the whole one), input and the target of the loss
    ``(y * target).sum()``, from the case's seed (the same in every process)."""
    import torch

    g = torch.Generator().manual_seed(case["seed"])
    full = torch.nn.Linear(case["in"], case["out"])
    with torch.no_grad():
        full.weight.copy_(torch.randn(full.weight.shape, generator=g) / case["in"] ** 0.5)
        full.bias.copy_(torch.randn(full.bias.shape, generator=g))
    x = torch.randn(case["rows"], case["in"], generator=g)
    target = torch.randn(case["rows"], case["out"], generator=g)  # loss = (y * target).sum()
    return full, x, target


_ROW_NAMES = (
    "the output",
    "the input slice's gradient",
    "the weight slice's gradient",
    "the bias's gradient",
)


def _row_worker(rank: int, world_size: int, fn, forbid, case) -> dict:
    """The learner's row-parallel Linear on this rank's slices: its output and the gradients
    its backward gives the input slice, the weight slice and the bias."""
    full, x, target = _drawn_linear(case)
    x_shard = x.chunk(world_size, dim=1)[rank].clone().requires_grad_(True)  # (rows, in/t)
    w_shard = full.weight.detach().chunk(world_size, dim=1)[rank].clone().requires_grad_(True)
    bias = full.bias.detach().clone().requires_grad_(True)  # (out,): the same on every rank
    return _learner_backward(
        fn,
        forbid,
        (x_shard, w_shard, bias, None),
        "fn(x_shard, weight_shard, bias, group)",
        target,
        (x_shard, w_shard, bias),
        _ROW_NAMES,
    )


def _row_references(case: dict, world_size: int) -> list[dict]:
    """What one process's ``nn.Linear`` gives each rank: the output and the slices of the
    gradients of the input and the weight, and the bias's gradient."""
    full, x, target = _drawn_linear(case)
    xr = x.clone().requires_grad_(True)
    y = full(xr)
    (y * target).sum().backward()
    assert xr.grad is not None and full.weight.grad is not None  # backward just filled them
    return [
        dict(
            zip(
                _ROW_NAMES,
                (
                    y.detach(),
                    xr.grad.chunk(world_size, dim=1)[rank],
                    full.weight.grad.chunk(world_size, dim=1)[rank],
                    full.bias.grad,
                ),
            )
        )
        for rank in range(world_size)
    ]


def collect_row_parallel(fn, task: int = 1) -> dict:
    """Task: ``fn(x_shard, weight_shard, bias, group)`` computes this rank's row-parallel
    Linear: ``x_shard`` (rows, in/t) and ``weight_shard`` (out, in/t) are this rank's slices of
    the input features, ``bias`` (out,) is whole; it returns the whole output (rows, out), the
    same on every rank, and its backward gives each rank the gradients of its own slices.

    Graded on 2 and 4 ranks against one process's ``nn.Linear`` of drawn shape, weights and
    batch: the output and the three gradients within 1e-6 + 1e-5 x max|reference| (float32)."""
    return _collect_on_ranks(task, fn, _row_worker, linear_case(task))


def judge_row_parallel(data: Any, task: int = 1) -> None:
    case = linear_case(task)
    hints = {
        "the output": "the partial products must be summed over the ranks (an all-reduce "
        "in forward), and the bias added once",
        "the input slice's gradient": "in backward every rank already holds the whole "
        "dL/dy: nothing to communicate",
        "the weight slice's gradient": "in backward every rank already holds the whole "
        "dL/dy: nothing to communicate",
        "the bias's gradient": "the bias is added once, after the sum",
    }
    for world_size in (2, 4):
        _compare(
            task,
            data.get(world_size) if isinstance(data, dict) else None,
            _row_references(case, world_size),
            f"{world_size} (nn.Linear({case['in']}, {case['out']}), {case['rows']} rows)",
            hints,
        )
    passed(
        task,
        "your row-parallel Linear equals nn.Linear on 2 and 4 ranks: output and the "
        "gradients of input, weight and bias",
    )


check_row_parallel = split_check(collect_row_parallel, judge_row_parallel)


# --------------------------------------------------------------------------------------------
# task 2: all-reduces of a 32-layer model
# --------------------------------------------------------------------------------------------
#: the course's counts, out of reach while the learner's count runs
COUNT_REFERENCES = (
    "course_lib.measure.estimate.tensor_parallel:tp_collectives_per_layer",
    "course_lib.units.u11_tensor_parallelism.run_scale:source_check",
    "course_lib.units.u11_tensor_parallelism.run_costs:collective_counts",
)


def count_case(task: int) -> dict:
    """Task 2: the model's depth (3-12 layers, never the lecture's 32) and the micro-batches of
    gradient accumulation in one training step (2-4)."""
    rng = case_rng(task, UNIT)
    return {"n_layer": rng.randint(3, 12), "microbatches": rng.randint(2, 4)}


def _count_worker(rank: int, world_size: int, n_layer: int, microbatches: int) -> dict:
    import torch

    from course_lib.measure.comm import CommMeter
    from course_lib.models import GPT, GPTConfig
    from course_lib.parallel.tensor import parallelize_gpt

    torch.manual_seed(0)
    config = GPTConfig(vocab_size=16, block_size=4, n_layer=n_layer, n_head=2, n_embd=8)
    model = parallelize_gpt(GPT(config))
    with CommMeter(dispatch=False) as meter:
        for _ in range(microbatches):  # one step: forward and backward of each micro-batch
            x = torch.randint(0, 16, (1, 4))
            logits = model(x)
            torch.nn.functional.cross_entropy(logits.flatten(0, 1), x.flatten()).backward()
    return {"calls": dict(meter.calls)}


def collect_allreduce_count(fn, task: int = 2) -> Any:
    """Task: ``fn(n_layer, microbatches)`` -> the int number of all-reduces tensor parallelism
    makes per rank in one training step (forward and backward of each of ``microbatches``
    micro-batches, gradient accumulation) of an ``n_layer`` transformer. Checked for a drawn
    depth and number of micro-batches against a tiny GPT of that depth split over 2 real
    ranks, counted by CommMeter."""
    case = count_case(task)
    n, k = case["n_layer"], case["microbatches"]
    return learner_number(run_learner(task, fn, n, k, forbid=COUNT_REFERENCES))


def judge_allreduce_count(data: Any, task: int = 2) -> None:
    case = count_case(task)
    n, k = case["n_layer"], case["microbatches"]
    got = expect_int(task, f"the number of all-reduces for {n} layers, {k} micro-batches", data)
    measured = _launch(task, _count_worker, 2, n, k)[0]["calls"].get("all_reduce", 0)
    if got != measured:
        fail(
            task,
            f"you said {got} all-reduces for {n} layers and {k} micro-batches "
            f"({got / (n * k):g} per layer and micro-batch); the GPT split over 2 ranks made "
            f"{'more' if measured > got else 'fewer'} in one step",
        )
    passed(task, "all-reduces per training step right for a drawn depth and micro-batch count")


check_allreduce_count = split_check(collect_allreduce_count, judge_allreduce_count)
