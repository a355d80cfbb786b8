"""From a plan to real ranks: the layout the planner chose, run by the course's own code without
re-stating it.

``plan.layout_of(result, rank=1)`` is the :class:`~course_lib.plan.Layout` of one row of a plan,
exactly as the search built it; :func:`run_layout` (``run_layout(layout)``) trains the tiny GPT of the 3-D run trained on
``layout.gpus`` ranks (gloo, ``course_lib.launch``) as the layout says: ZeRO 0 over dp x tp x pp
ranks is :func:`~course_lib.plan.three_d.run_3d`; ZeRO 1-3 over dp ranks (tp = pp = 1) is
``parallel.zero.ZeroDataParallel`` at that stage, on the dp group of a
``parallel.mesh.Mesh(layout)``. The model is scaled down to fit CPU ranks (the layout is kept);
the result reads like ``run_3d``'s, so ``three_d.parity_3d`` compares it with one process on the
full batch.

Introduced in notebooks/14_planning_a_run.ipynb.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from course_lib import validate as _v
from course_lib.dims import ParallelDims
from course_lib.models import GPTConfig
from course_lib.plan.specs import Layout
from course_lib.plan.three_d import run_3d
from course_lib.plan.three_d_reference import _build, make_batch, tiny_config
from course_lib.plan.three_d_result import RankRun3D, Run3D

__all__ = ["run_layout"]


@dataclass(frozen=True)
class _ZeroRun:
    """What every rank of a ZeRO run is told."""

    dims: ParallelDims
    zero: int
    steps: int
    batch: int
    lr: float
    seed: int
    config: GPTConfig


def _zero_rank(rank: int, world_size: int, run: _ZeroRun) -> RankRun3D:
    import torch
    import torch.distributed as dist

    from course_lib.measure.comm import CommMeter
    from course_lib.measure.memory import MemoryMeter
    from course_lib.parallel.mesh import Mesh
    from course_lib.parallel.zero import ZeroDataParallel

    mesh = Mesh(run.dims)  # rank order and groups from the layout's ParallelDims
    group, dp = mesh.group("dp"), run.dims.dp
    model = ZeroDataParallel(
        _build(run.config, run.seed),
        stage=run.zero,
        optimizer=torch.optim.Adam,
        group=group,
        lr=run.lr,
    )
    rows, losses = run.batch // dp, []
    with CommMeter(dispatch=False) as comm, MemoryMeter(model, model.optimizer) as mem:
        for step in range(run.steps):
            x, y = make_batch(step, run.batch, run.config, run.seed)
            x, y = (t[mesh.dp_rank * rows : (mesh.dp_rank + 1) * rows] for t in (x, y))
            model.zero_grad()
            logits = model(x)
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())
            loss.backward()
            model.step()
            mean = loss.detach().reshape(1)
            dist.all_reduce(mean, group=group)
            losses.append(mean.item() / dp)
    return RankRun3D.measured(
        rank, mesh.coords, losses, mem, model, comm, model.full_tensors("param")
    )


def run_layout(
    layout: Layout,
    *,
    steps: int = 2,
    lr: float = 1e-3,
    seed: int = 0,
    config: GPTConfig | None = None,
    timeout: float = 120.0,
) -> Run3D:
    """Train the tiny GPT ``steps`` steps on ``layout.gpus`` ranks laid out as ``layout`` says
    (its axes, ZeRO stage and micro-batch; each dp rank trains ``micro_batch`` sequences per
    micro-batch, ``pp`` micro-batches per step with a pipeline). Returns what ``run_3d`` returns
    (a ``Run3D``) with the layout as its ``plan_layout``.
    Refused: cp, ep or interleaving (the course's runs do not combine them with the others),
    and ZeRO 1-3 with tp or pp > 1 (``run_3d`` averages gradients as DDP does)."""
    import course_lib

    if not isinstance(layout, Layout):
        raise TypeError(f"layout = {_v.describe(layout)}: expected a plan.Layout")
    dims = layout.dims.require(("dp", "tp", "pp"), "a run of the course's code")
    config = config or tiny_config()
    m = dims.pp  # micro-batches per step: one per stage fills the pipeline
    batch = dims.dp * layout.micro_batch * m
    if layout.zero == 0:
        out = run_3d(
            dims,
            steps,
            batch=batch,
            microbatches=m,
            lr=lr,
            seed=seed,
            config=config,
            timeout=timeout,
        )
        return replace(out, plan_layout=layout)
    if dims.tp > 1 or dims.pp > 1:
        raise ValueError(
            f"zero = {layout.zero}: expected 0 with tp = {dims.tp}, pp = {dims.pp} (the 3-D run "
            "averages gradients as DDP does; ZeRO 1-3 runs on dp ranks alone)"
        )
    steps = _v.count("steps", steps, minimum=1)
    run = _ZeroRun(dims, layout.zero, steps, batch, lr, seed, config)
    ranks: list[RankRun3D] = course_lib.launch(_zero_rank, dims.world_size, run, timeout=timeout)
    return Run3D(
        ranks=tuple(ranks),
        losses=tuple(float(x) for x in ranks[0].losses if x is not None),
        params=ranks[0].params or {},
        dims=ParallelDims(dp=dims.dp, tp=dims.tp, pp=dims.pp),
        config=config,
        steps=steps,
        batch=batch,
        microbatches=m,
        lr=lr,
        seed=seed,
        plan_layout=layout,
    )
