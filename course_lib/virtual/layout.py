"""A planned layout on the virtual cluster: ``simulate_layout(shape, layout)`` traces one training
step of a :class:`course_lib.shape.ModelShape` laid out as a ``plan.Layout`` (or a
:class:`course_lib.dims.ParallelDims` and a ZeRO stage) says, without re-stating either.

The layout's axes become the world size and the tensor-parallel degree, its ZeRO stage the
strategy (3: FSDP2 ``fully_shard``; 2: ``fully_shard`` without resharding, the closest FSDP2
gets; 0: ``replicate``), its recomputation the checkpointing of every block, its micro-batch the
batch; the virtual cluster has no pipeline, context or expert parallelism, so those axes must be
1. Introduced in notebooks/14_planning_a_run.ipynb.
"""

from __future__ import annotations

from typing import Any

from course_lib import validate as _v
from course_lib.dims import ParallelDims
from course_lib.shape import ModelShape
from course_lib.virtual.model import llama_like

__all__ = ["layout_arguments", "simulate_layout"]

#: ZeRO stage -> the strategy that runs it on dp ranks (tp = 1)
_STRATEGY = {0: "ddp", 2: "fsdp_no_reshard", 3: "fsdp"}


def layout_arguments(
    shape: ModelShape,
    layout: Any,
    *,
    zero: int | None = None,
    seq: int | None = None,
    batch: int | None = None,
    **settings: Any,
) -> dict[str, Any]:
    """The keywords of ``simulate_step`` for ``shape`` laid out as ``layout`` (a ``plan.Layout``
    or a ParallelDims; ``zero``, ``batch`` and the recomputation are read from a Layout, or
    given). ``seq`` defaults to the shape's; ``settings`` (mixed_precision, timeout, ...) pass
    through."""
    if not isinstance(shape, ModelShape):
        raise TypeError(f"shape = {_v.describe(shape)}: expected a course_lib.shape.ModelShape")
    dims = ParallelDims.of(layout, "layout").require(("dp", "tp"), "the virtual cluster")
    stage = _v.choice("zero", getattr(layout, "zero", 3) if zero is None else zero, (0, 1, 2, 3))
    if dims.tp > 1:
        if dims.dp > 1 and stage != 3:
            raise ValueError(f"zero = {stage}: expected 3 with tp > 1 (strategy 'fsdp+tp')")
        strategy, tp = ("tp" if dims.dp == 1 else "fsdp+tp"), dims.tp
    elif stage in _STRATEGY:
        strategy, tp = _STRATEGY[stage], None
    else:
        raise ValueError("zero = 1: expected 0, 2 or 3 (FSDP2 has no stage that shards only Adam)")
    settings.setdefault("checkpoint", getattr(layout, "recompute", "none"))
    return dict(
        model_fn=llama_like(shape),
        world_size=dims.world_size,
        strategy=strategy,
        tp=tp,
        batch=getattr(layout, "micro_batch", 1) if batch is None else batch,
        seq=shape.seq if seq is None else seq,
        **settings,
    )


def simulate_layout(shape: ModelShape, layout: Any, **kwargs: Any) -> Any:
    """One training step of ``shape`` on the virtual cluster as ``layout`` lays it out
    (``simulate_step(**layout_arguments(shape, layout, **kwargs))``): a SimulatedStep."""
    from course_lib.virtual.simulate import simulate_step

    return simulate_step(**layout_arguments(shape, layout, **kwargs))
