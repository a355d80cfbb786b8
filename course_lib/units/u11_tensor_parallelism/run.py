"""Unit 11's measured runs (notebooks/11_tensor_parallelism.ipynb): tensor parallelism on real
ranks.

Every run goes through ``course_lib.launch`` (gloo on CPU; NCCL with one GPU per rank) and uses
the course's from-scratch ``parallel.tensor`` beside torch's DTensor ``parallelize_module``.
Arguments (heads, width, sequence not divisible by tp; tp larger than the world size) are
checked before any rank starts. Each function returns plain data or a tidy DataFrame:

- :func:`worked_example`: the sources' X (1x8) times W (8x16), split by columns and by rows on
  2 real ranks, each beside the single-process product;
- :func:`shard_shapes`: the shape of every weight on every rank of the split tiny GPT;
- :func:`parity`: loss, gradients and parameters of the split tiny GPT against one process
  (``parallel.harness``), tp = 1, 2, 4, with and without sequence parallelism;
- :func:`dtensor_loss`: the same model split by torch's ``ColwiseParallel``/``RowwiseParallel``:
  its loss beside ours and one process's, and CommDebugMode's collective counts;
- :func:`collective_counts`: collectives per phase counted by CommMeter in our version;
- :func:`wire_bytes`: bytes each rank wrote to its sockets per step, beside the ring model;
- :func:`memory_per_rank`: MemoryMeter in every rank: params, grads, Adam state, activations,
  beside ``estimate.tp_params_per_rank`` and ``estimate.activation_bytes_gpt``;
- :func:`activation_formulas`, :func:`scale_table`, :func:`source_check`, :func:`source_bytes`
  (in ``run_scale.py``, re-exported): Korthikanti et al.'s formulas, a Llama-7B / 70B layer at
  tp = 8 through ``measure.estimate``, and the sources' numbers recomputed;
- :func:`tp_threshold` (``run_threshold.py``): the hidden size from which the all-reduces stop
  dominating, measured.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import pandas as pd
import torch

from course_lib import kit, validate
from course_lib.models import GPT, Block, GPTConfig
from course_lib.parallel import harness as H
from course_lib.runtime.launch import launch
from course_lib.units.u11_tensor_parallelism._setup import (
    CONFIG,
    _check,
    _step_fn,
    batch_fn,
    model_fn,
)
from course_lib.units.u11_tensor_parallelism.run_costs import (
    collective_counts,
    memory_per_rank,
    wire_bytes,
    wire_summary,
)
from course_lib.units.u11_tensor_parallelism.run_threshold import tp_threshold

__all__ = [
    "CONFIG",
    "model_fn",
    "batch_fn",
    "worked_example",
    "shard_shapes",
    "parity",
    "dtensor_loss",
    "collective_counts",
    "wire_summary",
    "wire_bytes",
    "memory_per_rank",
    "activation_formulas",
    "LLAMA_7B",
    "LLAMA_70B",
    "scale_table",
    "source_check",
    "source_bytes",
    "tp_threshold",
]


# --------------------------------------------------------------------------------------------
# the worked example: X (1 x 8) times W (8 x 16) on 2 ranks
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ExampleRow:
    """One split and rank of :func:`worked_example` (shapes as tuples)."""

    split: str
    rank: int
    x_on_rank: tuple[int, ...]
    W_on_rank: tuple[int, ...] = field(metadata=kit.column("W_on_rank (in x out)"))
    local_product: tuple[int, ...]
    collective: str
    y: tuple[int, ...]
    equals_X_W: bool


def _example_worker(rank: int, world_size: int) -> list[ExampleRow]:
    from course_lib.measure.comm import CommMeter, collective_family
    from course_lib.parallel.tensor import ColumnParallelLinear, RowParallelLinear

    x = torch.arange(1.0, 9.0).view(1, 8)  # the sources' X = [1, 2, ..., 8]
    full = torch.nn.Linear(8, 16, bias=False)
    with torch.no_grad():
        full.weight.copy_(torch.arange(128.0).view(16, 8) / 64)  # W^T: (out 16, in 8)
    expected = full(x)
    rows = []
    for split, layer in [
        ("column", ColumnParallelLinear.from_linear(full, gather_output=True)),
        ("row", RowParallelLinear.from_linear(full, input_is_parallel=False)),
    ]:
        with CommMeter(dispatch=False) as meter:
            y = layer(x)
        local_x = x if split == "column" else x.chunk(world_size, dim=1)[rank]
        rows.append(
            ExampleRow(
                split,
                rank,
                tuple(local_x.shape),
                tuple(layer.weight.t().shape),
                tuple((local_x @ layer.weight.t()).shape),
                ", ".join(collective_family(op) for op in meter.calls) or "none",
                tuple(y.shape),
                bool(torch.allclose(y, expected)),
            )
        )
    return rows


def worked_example() -> pd.DataFrame:
    """The sources' example (S1): X of shape 1 x 8 times W of shape 8 x 16 on 2 ranks, split by
    columns of W (each rank: X times an 8 x 8 block, outputs concatenated by an all-gather) and
    by rows (each rank: its 1 x 4 slice of X times a 4 x 16 block, partial outputs summed by an
    all-reduce). One row per split and rank: shapes, the collective CommMeter saw, and whether
    the result equals X W computed in one process."""
    return kit.frame(kit.rows_of(launch(_example_worker, 2), ExampleRow), ExampleRow)


# --------------------------------------------------------------------------------------------
# shard shapes
# --------------------------------------------------------------------------------------------
#: how a parameter is split, by the dim in its ``tp_split`` (None: not split)
_SPLIT_NAMES: dict[int | None, str] = {0: "rows (column parallel)", 1: "columns (row parallel)"}


@dataclass(frozen=True)
class ShapeRow:
    """One rank and parameter of the first block in :func:`shard_shapes`."""

    rank: int
    tp_rank: int
    parameter: str
    full: tuple[int, ...]
    on_rank: tuple[int, ...]
    split: str


def _shapes_worker(rank: int, world_size: int, config: GPTConfig, tp: int) -> list[ShapeRow]:
    from course_lib.parallel.mesh import Mesh
    from course_lib.parallel.tensor import parallelize_gpt

    mesh = Mesh(dp=world_size // tp, tp=tp)
    model = parallelize_gpt(model_fn(config=config), mesh.group("tp"))
    full = dict(model_fn(config=config).named_parameters())
    block = "blocks.0."
    return [
        ShapeRow(
            rank,
            mesh.tp_rank,
            name[len(block) :],
            tuple(full[name].shape),
            tuple(p.shape),
            _SPLIT_NAMES.get(getattr(p, "tp_split", (None,))[0], "replicated"),
        )
        for name, p in model.named_parameters()
        if name.startswith(block)
    ]


def shard_shapes(
    tp: int = 2, *, config: GPTConfig = CONFIG, world_size: int | None = None
) -> pd.DataFrame:
    """The first block's parameters on every rank after ``parallelize_gpt`` over ``tp`` ranks
    (``world_size`` ranks in all, default ``tp``; the others are data-parallel copies). One row
    per rank and parameter: full shape, shape on the rank, how it is split. Refuses a ``tp``
    that does not divide the heads or the width, or exceeds ``world_size``, before launching."""
    world_size = tp if world_size is None else world_size
    tp = _check(tp, config, world_size=world_size)
    res = launch(_shapes_worker, world_size, config, tp)
    return kit.frame(kit.rows_of(res, ShapeRow), ShapeRow)


# --------------------------------------------------------------------------------------------
# parity with one process; torch's DTensor version
# --------------------------------------------------------------------------------------------
def _parity_worker(
    rank: int, world_size: int, steps: int, sp: bool, dtype: torch.dtype
) -> H.Record:
    from course_lib.parallel.tensor import gather_full, parallelize_gpt

    model = parallelize_gpt(model_fn(dtype=dtype), sequence_parallel=sp)
    return H.parallel_run(model, batch_fn, steps=steps, step_fn=_step_fn, gather_fn=gather_full)


@dataclass(frozen=True)
class ParityRow:
    """One (tp, sequence_parallel) of :func:`parity`."""

    tp: int
    sequence_parallel: bool
    comparisons: int
    failed: int
    worst: float
    ok: bool


def parity(
    tps: Sequence[int] = (1, 2, 4),
    *,
    sequence_parallel: Sequence[bool] = (False, True),
    steps: int = 2,
    dtype: torch.dtype = torch.float32,
) -> pd.DataFrame:
    """``steps`` SGD steps (lr 0.1) of the tiny GPT split over each tp, with and without
    sequence parallelism, against one process (``parallel.harness``; tolerance per tensor:
    1e-6 + 1e-5 x max|reference|, float32). One row per (tp, sequence_parallel): comparisons
    (losses, every gradient and parameter, every rank and step), failed, worst (the largest
    |difference| / tolerance), ok."""
    sizes = validate.counts("tps", tps, minimum=1)
    steps = validate.count("steps", steps, minimum=1)
    for t in sizes:
        _check(t, sequence_parallel=any(sequence_parallel))
    reference = H.reference_run(
        lambda s: model_fn(s, dtype=dtype), batch_fn, steps=steps, loss_fn=H.cross_entropy_loss
    )
    rows = []
    for t in sizes:
        for sp in dict.fromkeys(bool(sp) and t > 1 for sp in sequence_parallel):  # tp 1: no SP
            table = H.compare(reference, launch(_parity_worker, t, steps, bool(sp), dtype))
            worst = float((table.max_abs_diff / table.tolerance).max())
            failed, ok = int((~table.ok).sum()), bool(table.ok.all())
            rows.append(ParityRow(t, bool(sp), len(table), failed, worst, ok))
    return kit.frame(rows, ParityRow)


def _dtensor_gpt(model: GPT, tp_mesh: Any) -> GPT:
    """The tiny GPT split by torch's ``parallelize_module``. ColwiseParallel shards a Linear's
    output rows contiguously, so the fused qkv rows are first reordered rank by rank
    ([q_0 k_0 v_0 | q_1 k_1 v_1 | ...]) and the attention runs ``ParallelSelfAttention`` (heads
    = what the rank holds), as torchtitan does with its separate wq, wk, wv."""
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    from course_lib.parallel.tensor import ParallelSelfAttention

    t = tp_mesh.size()
    hs = model.config.n_embd // model.config.n_head
    for block in cast("Iterable[Block]", model.blocks):  # nn.ModuleList yields nn.Module
        att = block.attn
        qkv = att.c_attn
        with torch.no_grad():
            w = torch.cat(
                [
                    b
                    for r in range(t)
                    for b in [part.chunk(t, dim=0)[r] for part in qkv.weight.chunk(3, dim=0)]
                ]
            )
            qkv.weight.copy_(w)
            if qkv.bias is not None:
                qkv.bias.copy_(
                    torch.cat(
                        [
                            b
                            for r in range(t)
                            for b in [part.chunk(t)[r] for part in qkv.bias.chunk(3)]
                        ]
                    )
                )
        # not the CausalSelfAttention that Block declares: replace the submodule by name
        block.register_module("attn", ParallelSelfAttention(qkv, att.c_proj, hs, att.causal_mask))
        parallelize_module(
            block,
            tp_mesh,
            {
                "attn.c_attn": ColwiseParallel(),
                "attn.c_proj": RowwiseParallel(),
                "mlp.c_fc": ColwiseParallel(),
                "mlp.c_proj": RowwiseParallel(),
            },
        )
    return model


def _dtensor_worker(rank: int, world_size: int) -> dict[str, dict[str, Any]]:
    import warnings

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.debug import CommDebugMode

    from course_lib.parallel.tensor import parallelize_gpt

    # CommDebugMode's module hooks warn that the first block's input needs no gradient
    warnings.filterwarnings("ignore", message="Full backward hook is firing")
    x, y = batch_fn(0)
    counts = {}
    losses = {}
    for name in ("course", "dtensor"):
        model = model_fn()
        if name == "course":
            parallelize_gpt(model)
        else:
            _dtensor_gpt(model, init_device_mesh("cpu", (world_size,)))
        with CommDebugMode() as fwd:
            loss = H.cross_entropy_loss(model, (x, y))
        with CommDebugMode() as bwd:
            loss.backward()
        losses[name] = loss.item()
        counts[name] = {
            "forward": {str(k).split(".")[-1]: v for k, v in fwd.get_comm_counts().items()},
            "backward": {str(k).split(".")[-1]: v for k, v in bwd.get_comm_counts().items()},
        }
    return {"losses": losses, "counts": counts}


@dataclass(frozen=True)
class DTensorRow:
    """One tp of :func:`dtensor_loss`: the losses, and DTensor's collectives counted."""

    tp: int
    one_process: float
    course: float
    dtensor: float
    max_abs_diff: float
    dtensor_forward: dict[str, int]
    dtensor_backward: dict[str, int]


def dtensor_loss(tps: Sequence[int] = (2, 4)) -> pd.DataFrame:
    """The tiny GPT split with torch's DTensor ``parallelize_module`` (ColwiseParallel on qkv
    and c_fc, RowwiseParallel on the two output projections) and with ours, one forward and
    backward on the same batch, float32. One row per tp: the three losses, the largest
    difference to one process, and the collectives torch's ``CommDebugMode`` counted in
    forward and in backward for each version (it sees DTensor's functional collectives; ours
    are direct c10d calls, which it does not see: those are counted by CommMeter in
    :func:`collective_counts`)."""
    sizes = validate.counts("tps", tps, minimum=2)
    for t in sizes:
        _check(t)
    reference = H.cross_entropy_loss(model_fn(), batch_fn(0)).item()
    rows = []
    for t in sizes:
        res = launch(_dtensor_worker, t)[0]
        c, ours, theirs = (
            res["counts"]["dtensor"],
            res["losses"]["course"],
            res["losses"]["dtensor"],
        )
        diff = max(abs(ours - reference), abs(theirs - reference))
        rows.append(DTensorRow(t, reference, ours, theirs, diff, c["forward"], c["backward"]))
    return kit.frame(rows, DTensorRow)


# the formulas and the 7B / 70B scale-up (run_scale.py), re-exported here
from course_lib.units.u11_tensor_parallelism.run_scale import (  # noqa: E402
    LLAMA_7B,
    LLAMA_70B,
    activation_formulas,
    scale_table,
    source_bytes,
    source_check,
)
