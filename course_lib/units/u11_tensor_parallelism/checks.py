"""Unit 11's graded checks (solutions/11_tensor_parallelism.ipynb, exercises/11_tensor_parallelism.ipynb).

1. ``check_row_parallel``: the learner's row-parallel Linear (local matmul, all-reduce in
   forward, nothing in backward, bias once), run on 2 and 4 real gloo ranks against one
   process's ``nn.Linear``: output, and the gradients of the input slice, the weight slice and
   the bias; the course's own RowParallelLinear / g / f are out of reach inside the ranks;
2. ``check_allreduce_count``: the learner's count of the all-reduces of one training step with
   gradient accumulation, for a depth and a number of micro-batches drawn from the grading
   seed, against a GPT of that depth split over 2 real ranks, counted by CommMeter;
3. ``check_fixed_mlp``: the tensor-parallel MLP whose all-reduces were on the wrong side, fixed:
   output and gradients equal one process's MLP on 2 and 4 ranks.
Shapes, seeds and sizes are drawn from the grading seed (``course_lib.grading.seeds``): another
seed asks about other ones. Each check prints one deterministic line or raises
AssertionError("✗ task N: ...").
"""

from __future__ import annotations

from course_lib.grading.core import (
    error_pair,
    expect_int,
    fail,
    launch_learner,
    passed,
    run_learner,
)
from course_lib.grading.seeds import case_rng

__all__ = [
    "check_row_parallel",
    "check_allreduce_count",
    "check_fixed_mlp",
    "REFERENCES",
    "COUNT_REFERENCES",
]

#: the course's answers, out of reach while the learner's code runs in the ranks
REFERENCES = (
    "course_lib.parallel.tensor:RowParallelLinear",
    "course_lib.parallel.tensor:ColumnParallelLinear",
    "course_lib.parallel.tensor:ReduceFromTensorParallelRegion",
    "course_lib.parallel.tensor:CopyToTensorParallelRegion",
    "course_lib.parallel.tensor:ReduceScatterToSequenceRegion",
)
UNIT = "u11_tensor_parallelism"
GRADE_TIMEOUT_S = 60.0
RTOL, ATOL = 1e-5, 1e-6  # float32, per tensor: ATOL + RTOL x max|reference| (parallel.harness)


def _launch(task: int, worker, world_size: int, *args) -> list[dict]:
    return launch_learner(task, worker, world_size, *args, timeout=GRADE_TIMEOUT_S)


def _worst(got, ref) -> float:
    """max |got - ref| / (ATOL + RTOL max|ref|); inf when a shape differs or got is missing."""
    if got is None or tuple(got.shape) != tuple(ref.shape):
        return float("inf")
    return float((got.double() - ref.double()).abs().max()) / (
        ATOL + RTOL * float(ref.double().abs().max())
    )


def _compare(task: int, results: list[dict], world_size: str, hints: dict[str, str]) -> None:
    for rank, res in enumerate(results):
        for name, (got, ref) in res["pairs"].items():
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


def _reference_linear(case: dict):
    import torch

    g = torch.Generator().manual_seed(case["seed"])
    full = torch.nn.Linear(case["in"], case["out"])
    with torch.no_grad():
        full.weight.copy_(torch.randn(full.weight.shape, generator=g) / case["in"] ** 0.5)
        full.bias.copy_(torch.randn(full.bias.shape, generator=g))
    x = torch.randn(case["rows"], case["in"], generator=g)
    target = torch.randn(case["rows"], case["out"], generator=g)  # loss = (y * target).sum()
    return full, x, target


def _row_worker(rank: int, world_size: int, fn, forbid, case) -> dict:
    import torch

    from course_lib.grading.references import watch_references

    full, x, target = _reference_linear(case)
    xr = x.clone().requires_grad_(True)
    y_ref = full(xr)
    (y_ref * target).sum().backward()
    x_shard = x.chunk(world_size, dim=1)[rank].clone().requires_grad_(True)  # (rows, in/t)
    w_shard = full.weight.detach().chunk(world_size, dim=1)[rank].clone().requires_grad_(True)
    bias = full.bias.detach().clone().requires_grad_(True)  # (out,): the same on every rank
    used: list[str] = []
    try:
        with watch_references(forbid) as used:
            y = fn(x_shard, w_shard, bias, None)
            if not isinstance(y, torch.Tensor):
                raise TypeError(
                    f"fn(x_shard, weight_shard, bias, group) = a {type(y).__name__}: expected a tensor"
                )
            (y * target).sum().backward()
    except Exception as exc:  # noqa: BLE001 - reported in the verdict
        return {"used": list(used), "error": error_pair(exc)}
    ref_w = full.weight.grad.chunk(world_size, dim=1)[rank]
    ref_x = xr.grad.chunk(world_size, dim=1)[rank]
    return {
        "used": list(used),
        "pairs": {
            "the output": (y.detach(), y_ref.detach()),
            "the input slice's gradient": (x_shard.grad, ref_x),
            "the weight slice's gradient": (w_shard.grad, ref_w),
            "the bias's gradient": (bias.grad, full.bias.grad),
        },
    }


def check_row_parallel(fn, task: int = 1) -> None:
    """Task: ``fn(x_shard, weight_shard, bias, group)`` computes this rank's row-parallel
    Linear: ``x_shard`` (rows, in/t) and ``weight_shard`` (out, in/t) are this rank's slices of
    the input features, ``bias`` (out,) is whole; it returns the whole output (rows, out), the
    same on every rank, and its backward gives each rank the gradients of its own slices.

    Graded on 2 and 4 ranks against one process's ``nn.Linear`` of drawn shape, weights and
    batch: the output and the three gradients within 1e-6 + 1e-5 x max|reference| (float32)."""
    if not callable(fn):
        fail(task, f"expected a function, got {type(fn).__name__} {fn!r}")
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
            _launch(task, _row_worker, world_size, fn, list(REFERENCES), case),
            f"{world_size} (nn.Linear({case['in']}, {case['out']}), {case['rows']} rows)",
            hints,
        )
    passed(
        task,
        "your row-parallel Linear equals nn.Linear on 2 and 4 ranks: output and the "
        "gradients of input, weight and bias",
    )


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


def check_allreduce_count(fn, task: int = 2) -> None:
    """Task: ``fn(n_layer, microbatches)`` -> the int number of all-reduces tensor parallelism
    makes per rank in one training step (forward and backward of each of ``microbatches``
    micro-batches, gradient accumulation) of an ``n_layer`` transformer. Checked for a drawn
    depth and number of micro-batches against a tiny GPT of that depth split over 2 real
    ranks, counted by CommMeter."""
    case = count_case(task)
    n, k = case["n_layer"], case["microbatches"]
    got = run_learner(task, fn, n, k, forbid=COUNT_REFERENCES)
    got = expect_int(task, f"the number of all-reduces for {n} layers, {k} micro-batches", got)
    measured = _launch(task, _count_worker, 2, n, k)[0]["calls"].get("all_reduce", 0)
    if got != measured:
        fail(
            task,
            f"you said {got} all-reduces for {n} layers and {k} micro-batches "
            f"({got / (n * k):g} per layer and micro-batch); the GPT split over 2 ranks made "
            f"{'more' if measured > got else 'fewer'} in one step",
        )
    passed(task, "all-reduces per training step right for a drawn depth and micro-batch count")


# --------------------------------------------------------------------------------------------
# task 3: the MLP with its all-reduces on the wrong side, fixed
# --------------------------------------------------------------------------------------------
def mlp_case(task: int) -> dict:
    """Task 3's MLP: width, batch shape (rows, seq) and seed."""
    rng = case_rng(task, UNIT)
    return {
        "width": rng.choice((4, 6, 8, 12)),
        "shape": (rng.randint(1, 3), rng.randint(2, 5)),
        "seed": rng.randrange(10_000),
    }


def _mlp_worker(rank: int, world_size: int, fn, forbid, case) -> dict:
    import torch
    import torch.nn.functional as F

    from course_lib.grading.references import watch_references

    WIDTH = case["width"]
    torch.manual_seed(case["seed"])
    fc, proj = torch.nn.Linear(WIDTH, 4 * WIDTH), torch.nn.Linear(4 * WIDTH, WIDTH, bias=False)
    x = torch.randn(*case["shape"], WIDTH)
    target = torch.randn(*case["shape"], WIDTH)
    xr = x.clone().requires_grad_(True)
    y_ref = proj(F.gelu(fc(xr)))
    (y_ref * target).sum().backward()
    fc_grad, proj_grad = fc.weight.grad, proj.weight.grad
    assert fc_grad is not None and proj_grad is not None  # backward just filled them
    # this rank's shards: c_fc's output rows (column parallel), c_proj's input columns (row)
    my_fc = torch.nn.Linear(WIDTH, 4 * WIDTH // world_size)
    my_proj = torch.nn.Linear(4 * WIDTH // world_size, WIDTH, bias=False)
    with torch.no_grad():
        my_fc.weight.copy_(fc.weight.chunk(world_size, dim=0)[rank])
        my_fc.bias.copy_(fc.bias.chunk(world_size)[rank])
        my_proj.weight.copy_(proj.weight.chunk(world_size, dim=1)[rank])
    xl = x.clone().requires_grad_(True)
    used: list[str] = []
    try:
        with watch_references(forbid) as used:
            y = fn(xl, my_fc, my_proj, None)
            if not isinstance(y, torch.Tensor):
                raise TypeError(
                    f"fn(x, c_fc, c_proj, group) = a {type(y).__name__}: expected a tensor"
                )
            (y * target).sum().backward()
    except Exception as exc:  # noqa: BLE001
        return {"used": list(used), "error": error_pair(exc)}
    return {
        "used": list(used),
        "pairs": {
            "the output": (y.detach(), y_ref.detach()),
            "the input's gradient": (xl.grad, xr.grad),
            "c_fc's weight gradient": (
                my_fc.weight.grad,
                fc_grad.chunk(world_size, 0)[rank],
            ),
            "c_proj's weight gradient": (
                my_proj.weight.grad,
                proj_grad.chunk(world_size, 1)[rank],
            ),
        },
    }


def check_fixed_mlp(fn, task: int = 3) -> None:
    """Task: ``fn(x, c_fc, c_proj, group)``, the tensor-parallel MLP (c_fc: this rank's
    column shard, c_proj: its row shard, no bias) with its communication on the right sides:
    the whole output on every rank, and the gradients of one process's MLP. Graded on 2 and 4
    ranks, width, batch and weights drawn."""
    if not callable(fn):
        fail(task, f"expected a function, got {type(fn).__name__} {fn!r}")
    case = mlp_case(task)
    hint = (
        "the MLP's input is the same on every rank (copy in, sum the gradient in "
        "backward); its output is a partial sum (sum it in forward, copy the gradient)"
    )
    hints = {
        k: hint
        for k in (
            "the output",
            "the input's gradient",
            "c_fc's weight gradient",
            "c_proj's weight gradient",
        )
    }
    for world_size in (2, 4):
        _compare(
            task,
            _launch(task, _mlp_worker, world_size, fn, list(REFERENCES), case),
            f"{world_size} (MLP of width {case['width']})",
            hints,
        )
    passed(
        task,
        "the fixed MLP equals one process on 2 and 4 ranks: output, input gradient "
        "and both weight gradients",
    )
