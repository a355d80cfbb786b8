"""How long a pipeline stage's matrix products take on one rank, the compute terms of
``plan.step_time``: the stage's FLOPs at one efficiency (``Assumptions.matmul_efficiency`` x the
GPU's peak, weight products twice as fast with FP8), or product by product from their shapes
(``plan.gemm_time``, ``Assumptions(matmul_model="by shape")``). Introduced in
notebooks/14_planning_a_run.ipynb.
"""

from __future__ import annotations

from typing import Any

from course_lib.measure import estimate
from course_lib.plan import gemm_time
from course_lib.plan.comm_model import Assumptions
from course_lib.plan.specs import ClusterSpec, Layout, ModelSpec, recompute_flops

__all__ = ["stage_flops", "compute_s", "shape_layer"]


def stage_flops(
    model: ModelSpec, layout: Layout, layers: int, *, output: bool
) -> tuple[int, int, int]:
    """(weight-product FLOPs, attention FLOPs, recomputed FLOPs) per token of a stage of
    ``layers`` layers (MoE layers where the model has experts: the parameters a token uses; the
    K/V heads tp > kv_heads replicates, ``ModelSpec.kv_replicated``), with the output layer's
    6 V h when ``output``. Attention: 12 s w per layer, w = ``ModelShape.attention_width``;
    recomputed: what the layout's recomputation and attention kernel run again
    (``specs.recompute_flops``)."""
    h, s = model.attention_width, model.seq
    per_layer = model.layer_params()["moe_active" if model.experts else "dense"]
    per_layer += model.kv_replicated(layout.tp)  # K/V heads every rank of a group computes
    weights = estimate.training_flops_per_token(layers * per_layer)
    attention = estimate.training_flops_per_token(0, layers=layers, hidden=h, seq=s)
    extra = recompute_flops(per_layer, layers, h, s, layout.recompute, layout.kernel)
    out = estimate.training_flops_per_token(model.vocab * model.hidden) if output else 0
    return weights + out, attention, extra


def compute_s(
    model: ModelSpec,
    cluster: ClusterSpec,
    layout: Layout,
    stages: tuple[int, int],
    how: Assumptions,
) -> tuple[float, float]:
    """(compute, recompute) seconds of one micro-batch on the slowest stage: a middle one (the
    first of ``stages``' layer counts) or the last with the output layer (the second). Each rank
    does 1 / (tp cp) of the stage's work; weight products at twice the rate with ``fp8``."""
    n, n_last = stages
    slower = cluster.sms / (cluster.sms - how.comm_sms) if how.comm_sms else 1.0
    if how.matmul_model == "by shape":
        c, r = _compute_by_shape(model, cluster, layout, stages, how)
        return c * slower, r * slower
    rate = how.matmul_efficiency * cluster.peak_flops / slower
    speedup = 2 if how.fp8 else 1
    per_rank = layout.micro_batch * model.seq / (layout.tp * layout.cp)

    def seconds(flops: tuple[int, int, int]) -> tuple[float, float]:
        weights, attention, extra = flops
        return (weights / speedup + attention) * per_rank / rate, extra * per_rank / rate

    return max(
        seconds(stage_flops(model, layout, n, output=layout.pp == 1)),
        seconds(stage_flops(model, layout, n_last, output=True)),
        key=sum,
    )


def shape_layer(model: ModelSpec, cluster: ClusterSpec, layout: Layout, how: Assumptions) -> Any:
    """``plan.gemm_time.layer_time`` of one layer of ``model`` on a rank of ``layout``, with
    its attention kernel (``Layout.kernel``): flash moves no scores through memory, eager
    writes and reads them (the products' extra bytes and the softmax's)."""
    queries = model.seq // layout.cp
    return gemm_time.layer_time(
        model, cluster, layout.tp, layout.ep, layout.micro_batch * queries, queries,
        layout.kernel == "flash", layout.sequence_parallel, how.fp8, how.capacity_factor,
        layout.etp,
    )  # fmt: skip


def _compute_by_shape(
    model: ModelSpec,
    cluster: ClusterSpec,
    layout: Layout,
    stages: tuple[int, int],
    how: Assumptions,
) -> tuple[float, float]:
    """:func:`compute_s` product by product (``plan.gemm_time``): a layer's forward, three
    times for forward and backward (the backward's two products per weight product have its
    FLOPs), the output layer on the last stage. Run again (``specs.recompute_flops``'s
    count): eager, the attention core's forward (selective) or the layer's (full); flash, the
    core's forward for its backward's scores, and with full the layer's forward besides."""
    lt = shape_layer(model, cluster, layout, how)
    layer = lt.weights + lt.core + lt.elementwise
    if layout.kernel == "flash":
        again = lt.core + (layer if layout.recompute == "full" else 0.0)
    else:
        again = {"none": 0.0, "selective": lt.core, "full": layer}[layout.recompute]

    def stage(n: int, output: bool) -> tuple[float, float]:
        return 3 * (n * layer + (lt.output if output else 0.0)), n * again

    n, n_last = stages
    return max(stage(n, layout.pp == 1), stage(n_last, True), key=sum)
