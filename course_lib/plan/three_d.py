"""The capstone's real 3-D run: the tiny GPT trained with dp × tp × pp ranks at once, on one mesh.

Introduced in notebooks/14_planning_a_run.ipynb. Every piece is the course's own:

* :class:`course_lib.parallel.mesh.Mesh` lays the ranks out as ``(pp, dp, tp)`` (tp innermost)
  and gives each rank its three process groups;
* :func:`course_lib.parallel.tensor.parallelize_gpt` splits every block's attention and MLP over
  the tp group (Megatron column/row layers, 2 all-reduces forward and 2 backward per block);
* :class:`course_lib.parallel.pipeline.PipelineRank` and :func:`~course_lib.parallel.pipeline.run_schedule`
  cut the model into ``pp`` stages and run GPipe over the micro-batches, with send/recv to the
  ranks of this rank's pp group (the stage owner is a global rank taken from the mesh);
* :func:`course_lib.parallel.ddp.allreduce_gradients` averages the gradients over the dp group
  after the pipeline's backward;
* :class:`~course_lib.measure.memory.MemoryMeter` measures each rank's parameters, gradients
  and optimizer state, :class:`~course_lib.measure.comm.CommMeter` what it sends.

The model is cut as ``[embeddings] + blocks + [ln_f, lm_head]``: stage 0 holds the embeddings
and the first L/pp blocks, the last stage the last blocks, the final LayerNorm and the head.
The output matrix is not tied to the embedding (a tied one would live on two stages and need
its own all-reduce between them). :func:`run_3d` trains ``steps`` steps and returns a
:class:`~course_lib.plan.three_d_result.Run3D`: each rank's measurements (a ``RankRun3D``) and
the full parameters after training reassembled from the shards, so :func:`reference_3d` (one
process, full batch, same seed) can be compared with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from course_lib import validate
from course_lib.dims import ParallelDims
from course_lib.models import GPT, GPTConfig
from course_lib.plan.specs import Layout
from course_lib.plan.three_d_reference import (
    _build,
    _optimizer,
    make_batch,
    reference_3d,
    tiny_config,
    tiny_spec,
)
from course_lib.plan.three_d_result import RankRun3D, Run3D

if TYPE_CHECKING:
    from course_lib.parallel.pipeline import Action, PipelineRank

__all__ = [
    "tiny_config",
    "tiny_spec",
    "make_batch",
    "reference_3d",
    "run_3d",
    "Run3D",
    "RankRun3D",
    "parity_3d",
    "memory_table",
    "comm_table",
    "LOSS_RTOL",
    "PARAM_TOL",
]


class _Embed(nn.Module):
    pos: torch.Tensor

    def __init__(self, model: GPT):
        super().__init__()
        self.wte, self.wpe = model.wte, model.wpe
        pos = model.pos
        assert isinstance(pos, torch.Tensor)
        self.register_buffer("pos", pos, persistent=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:  # (b, s) int64 -> (b, s, h)
        out: torch.Tensor = self.wte(idx) + self.wpe(self.pos[: idx.shape[1]])
        return out


class _Head(nn.Module):
    def __init__(self, model: GPT):
        super().__init__()
        self.ln_f, self.lm_head = model.ln_f, model.lm_head

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (b, s, h) -> (b, s, vocab)
        out: torch.Tensor = self.lm_head(self.ln_f(x))
        return out


def _layers(model: GPT) -> nn.Sequential:
    """The model as a list of pipeline layers: embeddings, blocks, head."""
    return nn.Sequential(_Embed(model), *model.blocks, _Head(model))


def _full_name(index: int, rest: str, n_layer: int) -> str:
    """Name in the unsplit GPT of parameter ``rest`` of pipeline layer ``index``."""
    if index == 0 or index == n_layer + 1:
        return rest
    return f"blocks.{index - 1}.{rest}"


def _ce(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def _mean_loss(loss: torch.Tensor | None, dp_group: Any, dp: int) -> float | None:
    """The step's loss: the last stage's (mean over its replica's rows), then over dp; None on
    the other stages (which still join the all-reduce)."""
    import torch.distributed as dist

    value = torch.zeros(1) if loss is None else loss.detach().reshape(1)
    dist.all_reduce(value, group=dp_group)
    return value.item() / dp if loss is not None else None


def _full_params(
    shards: dict[str, torch.Tensor], split: list[range], n_layer: int
) -> dict[str, torch.Tensor]:
    """This rank's gathered stage parameters under their names in the unsplit GPT."""
    full = {}
    for name, t in shards.items():
        _, stage, j, rest = name.split(".", 3)  # stages.<k>.<j>.<rest>
        full[_full_name(split[int(stage)].start + int(j), rest, n_layer)] = t
    return full


@dataclass(frozen=True)
class _Run3D:
    """What every rank of :func:`run_3d` is told: the layout and the training settings."""

    dp: int
    tp: int
    pp: int
    steps: int
    batch: int
    microbatches: int
    lr: float
    seed: int
    config: GPTConfig


def _rank_fn(rank: int, world_size: int, run: _Run3D) -> RankRun3D:
    from course_lib.measure.comm import CommMeter
    from course_lib.measure.memory import MemoryMeter
    from course_lib.parallel.ddp import allreduce_gradients
    from course_lib.parallel.mesh import Mesh
    from course_lib.parallel.pipeline import PipelineRank, gpipe_order, split_layers
    from course_lib.parallel.tensor import gather_full, parallelize_gpt

    dp, pp, microbatches, config = run.dp, run.pp, run.microbatches, run.config
    mesh = Mesh(dp=dp, tp=run.tp, pp=pp)
    tp_group, dp_group = mesh.group("tp"), mesh.group("dp")
    pp_ranks = mesh.ranks("pp")  # global ranks of this rank's pipeline, by stage

    model = parallelize_gpt(_build(config, run.seed), group=tp_group)  # same seed everywhere
    n_layer = config.n_layer
    split = split_layers(n_layer + 2, pp, sizes=_stage_sizes(n_layer, pp))
    pipe = PipelineRank(
        _layers(model), split, mesh.rank, pp, owner=lambda stage, ranks: pp_ranks[stage % ranks]
    )
    del model
    opt = _optimizer(pipe.parameters(), run.lr)
    order = gpipe_order(mesh.pp_rank, pp, microbatches)
    rows = run.batch // dp
    shape = (rows // microbatches, config.block_size, config.n_embd)
    losses = []
    with CommMeter(dispatch=False) as comm, MemoryMeter(pipe, opt) as mem:
        for step in range(run.steps):
            x, y = make_batch(step, run.batch, config, run.seed)
            x, y = (t[mesh.dp_rank * rows : (mesh.dp_rank + 1) * rows] for t in (x, y))
            opt.zero_grad()
            loss = run_schedule_3d(pipe, order, x, y, microbatches, shape, mesh.pp_rank, pp)
            allreduce_gradients(pipe, group=dp_group)  # mean over the dp replicas
            opt.step()
            losses.append(_mean_loss(loss, dp_group, dp))
    full = _full_params(gather_full(pipe, "param", group=tp_group), split, n_layer)
    params = full if mesh.tp_rank == 0 else None
    return RankRun3D.measured(rank, mesh.coords, losses, mem, pipe, comm, params)


def run_schedule_3d(
    pipe: PipelineRank,
    order: Sequence[Action],
    x: torch.Tensor,
    y: torch.Tensor,
    microbatches: int,
    shape: Sequence[int],
    pp_rank: int,
    pp: int,
) -> torch.Tensor | None:
    """One GPipe step of this rank's stage: the first stage reads the token ids, the last the
    targets; every message is one (b/m, s, h) activation or its gradient."""
    from course_lib.parallel.pipeline import run_schedule

    return run_schedule(
        pipe,
        order,
        x if pp_rank == 0 else None,
        y if pp_rank == pp - 1 else None,
        microbatches=microbatches,
        loss_fn=_ce,
        message_shape=shape,
    )


def _stage_sizes(n_layer: int, pp: int) -> list[int]:
    """Pipeline layers (embeddings, blocks, head) of each stage: L/pp blocks each, the
    embeddings with the first, the head with the last."""
    sizes = [n_layer // pp] * pp
    sizes[0] += 1
    sizes[-1] += 1
    return sizes


def run_3d(
    dp: int | ParallelDims | Layout = 2,
    tp: int = 2,
    pp: int = 2,
    steps: int = 2,
    *,
    batch: int = 8,
    microbatches: int = 2,
    lr: float = 1e-3,
    seed: int = 0,
    config: GPTConfig | None = None,
    timeout: float = 120.0,
) -> Run3D:
    """Train the tiny GPT ``steps`` steps on dp × tp × pp ranks (``course_lib.launch``, gloo).

    Returns a :class:`~course_lib.plan.three_d_result.Run3D`: ``ranks`` (a ``RankRun3D`` each:
    coords (pp, dp, tp), losses (None off the last stage), memory (MemoryMeter's
    params/grads/optimizer bytes at the end), peak_bytes, params_numel, buffer_bytes, comm
    (CommMeter's summary: model and wire bytes sent), calls (op -> count)), ``losses`` (loss
    per step), ``params`` (full parameters after training, reassembled from the shards),
    ``dims``, ``config`` and the settings; ``to_frame()`` is one row per rank. ``dp`` may be a
    ``plan.Layout`` or a ``ParallelDims`` instead of the three sizes (its cp, ep and virtual
    stages 1).
    """
    import course_lib

    if isinstance(dp, ParallelDims | Layout):  # a plan's layout: its dp x tp x pp, as laid out
        d = ParallelDims.of(dp).require(("dp", "tp", "pp"), "the 3-D run")
        dp, tp, pp = d.dp, d.tp, d.pp
    config = config or tiny_config()
    dp = validate.count("dp", dp, minimum=1)
    tp = validate.count("tp", tp, minimum=1)
    pp = validate.count("pp", pp, minimum=1)
    steps = validate.count("steps", steps, minimum=1)
    m = validate.count("microbatches", microbatches, minimum=1)
    batch = validate.count("batch", batch, minimum=1)
    if config.n_layer % pp:
        raise ValueError(f"pp = {pp}: expected a divisor of n_layer = {config.n_layer}")
    if batch % (dp * m):
        raise ValueError(
            f"batch = {batch}: expected a multiple of dp × microbatches = {dp} × {m} = {dp * m}"
        )
    from course_lib.parallel.tensor import check_tp

    check_tp(config, tp)
    run = _Run3D(dp, tp, pp, steps, batch, m, lr, seed, config)
    return _result(run, course_lib.launch(_rank_fn, dp * tp * pp, run, timeout=timeout))


def _result(run: _Run3D, ranks: list[RankRun3D]) -> Run3D:
    """The run from its ranks' answers: the last stage's losses, the parameters of dp replica 0
    (every stage's, gathered over tp) under the unsplit model's names."""
    last = [r for r in ranks if r.coords[0] == run.pp - 1]
    params: dict[str, torch.Tensor] = {}
    for r in ranks:
        if r.params is not None and r.coords[1] == 0:
            params.update(r.params)
    return Run3D(
        ranks=tuple(ranks),
        losses=tuple(cast(float, x) for x in last[0].losses),  # the last stage has them all
        params=params,
        dims=ParallelDims(dp=run.dp, tp=run.tp, pp=run.pp),
        config=run.config,
        steps=run.steps,
        batch=run.batch,
        microbatches=run.microbatches,
        lr=run.lr,
        seed=run.seed,
    )


# what a run_3d result is read with lives in three_d_report; re-exported here
from course_lib.plan.three_d_report import (  # noqa: E402
    LOSS_RTOL,
    PARAM_TOL,
    comm_table,
    memory_table,
    parity_3d,
)
