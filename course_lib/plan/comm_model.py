"""The planner's communication terms: which link each group of ranks crosses, what a collective
costs on it (bandwidth and per-message latency, two levels when the group spans nodes), and how
much of each term the step hides (:class:`Assumptions`, every number with its source).

Ranks are numbered tp innermost, then cp, dp, pp (Megatron's order, owned by
``course_lib.dims.ParallelDims``: ``layout.dims.stride(axis)``; Llama 3's puts pp inside dp,
which changes no link the planner prices). A group of ``size`` ranks that sit ``stride``
apart keeps min(size, G / stride) of them in each node of G GPUs; when it spans nodes, the
collective runs in two levels (``estimate.hierarchical_allreduce_time``: NVLink inside the node,
the network across), and a point-to-point or ring exchange runs at the network's pace. Every
message pays the link's alpha (``ClusterSpec.alpha_intra_s`` / ``alpha_inter_s``, from NCCL's
cost model via ``estimate.link_speed``). Introduced in notebooks/14_planning_a_run.ipynb.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass

from course_lib import validate as _v
from course_lib.measure import estimate
from course_lib.plan.specs import ClusterSpec, Layout, ModelSpec

__all__ = [
    "Assumptions",
    "DEFAULT_ASSUMPTIONS",
    "MATMUL_MODELS",
    "EP_SCHEDULE_NAMES",
    "ASSUMPTION_SOURCES",
    "no_latency",
    "span",
    "allreduce_s",
    "tp_comm_s",
    "cp_comm_s",
    "p2p_s",
    "dp_comm_s",
]

#: where each default of :class:`Assumptions` comes from
ASSUMPTION_SOURCES = {
    "matmul_efficiency": "an assumption: the fraction of the dense bf16 peak that a training "
    "step's large matrix products sustain. Megatron-LM's 2022 runs on A100 reached 56 % MFU "
    "(Korthikanti et al. 2022, arXiv:2205.05198, Table 5), Llama 3's on H100 38-43 % (Llama "
    "Team 2024, arXiv:2407.21783, Table 4), so the products themselves ran at 60 % or more",
    "tp_overlap": "0: Megatron's tensor-parallel all-reduces (all-gathers and reduce-scatters "
    "with sequence parallelism) sit between the products that need them (Korthikanti et al. "
    "2022, Sec. 4.2.2)",
    "cp_overlap": "0: Llama 3's all-gather of K and V runs before the attention that needs it "
    "(arXiv:2407.21783, Sec. 3.3.2); ring attention can hide its sends behind the blocks",
    "ep_overlap": "0: a plain MoE layer waits for its dispatch and combine all-to-alls; "
    "DeepSeek-V3's DualPipe hides them behind another micro-batch's compute (arXiv:2412.19437, "
    "Sec. 3.2.1: 1.0 there)",
    "dp_overlap": "1: the fraction of a micro-batch's compute that data-parallel traffic can "
    "hide behind: DDP all-reduces buckets during backward (Li et al. 2020, arXiv:2006.15704), "
    "FSDP prefetches the next layer's weights during compute (Zhao et al. 2023, "
    "arXiv:2304.11277); below 1 where the traffic contends with compute for SMs and memory",
    "p2p_overlap": "0: a stage waits for the activation it receives (1F1B, Narayanan et al. "
    "2021, arXiv:2104.04473)",
    "fp8": "False: products in bf16; True runs the weight products at twice the bf16 peak (H100 "
    "data sheet: 1,979 vs 989 dense TFLOP/s), attention in bf16, as DeepSeek-V3 did (Sec. 3.3); "
    "by shape, at the FP8 products' measured fraction of the FP8 peak (0.68 at 8192^3: "
    "estimate.GEMM_CALIBRATIONS)",
    "ep_schedule": "'none': the all-to-alls wait for nothing to hide behind; '1F1B-overlapped' "
    "hides them behind the attention of the micro-batch running beside (Megatron-Core), "
    "'DualPipe' behind the paired chunk's whole layer (arXiv:2412.19437 Sec. 3.2.1); what the "
    "compute does not cover stays exposed (plan.moe_time)",
    "ep_node_limit": "0: each token's copies travel on their own; DeepSeek-V3 sends each token "
    "to at most M = 4 nodes, once per node, forwarded inside it over NVLink (Sec. 2.1.2, 3.2.2)",
    "comm_sms": "0: every SM computes; DeepSeek-V3 gives 20 of the H800's 132 SMs to its "
    "all-to-all kernels (arXiv:2412.19437 Sec. 3.2.2), so its products run on 112 (compute x "
    "sms / (sms - comm_sms))",
    "capacity_factor": "1.0: the busiest rank receives the mean of the tokens (balanced "
    "routing); a capacity factor c lets it receive up to c times the mean (Switch Transformer, "
    "arXiv:2101.03961 Sec. 2.2): its all-to-all, and by shape its expert products, take c "
    "times as long (the other ranks wait for it)",
    "matmul_model": "'flat': every product at matmul_efficiency x the peak. 'by shape': each "
    "product of a layer timed from its shape (plan.gemm_time: the roofline of the card's FLOP/s "
    "and memory bandwidth at the fraction of the peak an H100's 8192^3 GEMMs reach, measured "
    "by the course's GPU check, docs/gpu-check-2026-11-27.md), plus the memory-bound kernels "
    "between them at the memory bandwidth; matmul_efficiency is then unused",
}
#: the compute models :class:`Assumptions` knows
MATMUL_MODELS = ("flat", "by shape")
#: the pipeline schedules whose hiding of the expert all-to-alls is modelled
#: (``plan.moe_time.EP_SCHEDULES`` says what each hides)
EP_SCHEDULE_NAMES = ("none", "1F1B-overlapped", "DualPipe")


@dataclass(frozen=True)
class Assumptions:
    """What the step-time model assumes beyond the hardware, each a parameter with its source in
    :data:`ASSUMPTION_SOURCES`: the matmul efficiency, and the fraction of each communication
    term that overlaps compute (0 = all of it on the critical path; data-parallel traffic is
    overlapped with backward bucket by bucket, ``estimate.ddp_exposed_comm_time``)."""

    matmul_efficiency: float = 0.6
    tp_overlap: float = 0.0
    cp_overlap: float = 0.0
    ep_overlap: float = 0.0
    p2p_overlap: float = 0.0
    dp_overlap: float = 1.0
    fp8: bool = False
    matmul_model: str = "flat"
    ep_schedule: str = "none"
    ep_node_limit: int = 0
    capacity_factor: float = 1.0
    comm_sms: int = 0

    def __post_init__(self) -> None:
        _v.count("comm_sms", self.comm_sms, minimum=0)
        _v.choice("matmul_model", self.matmul_model, MATMUL_MODELS)
        _v.choice("ep_schedule", self.ep_schedule, EP_SCHEDULE_NAMES)
        _v.count("ep_node_limit", self.ep_node_limit, minimum=0)
        _v.number("capacity_factor", self.capacity_factor, minimum=1, finite=True)
        _v.number("matmul_efficiency", self.matmul_efficiency, positive=True, maximum=1)
        for f in ("tp_overlap", "cp_overlap", "ep_overlap", "p2p_overlap", "dp_overlap"):
            _v.number(f, getattr(self, f), minimum=0, maximum=1)
        if not isinstance(self.fp8, bool):
            raise TypeError(f"fp8 = {self.fp8!r}: expected True or False")

    def replace(self, **changes: float | bool | str) -> Assumptions:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]


DEFAULT_ASSUMPTIONS = Assumptions()


@functools.cache
def no_latency(cluster: ClusterSpec) -> ClusterSpec:
    """The same cluster with no per-message latency (what the bytes alone cost)."""
    return dataclasses.replace(cluster, alpha_intra_s=0.0, alpha_inter_s=0.0)


def span(cluster: ClusterSpec, stride: int, size: int) -> tuple[int, int]:
    """(nodes, ranks per node) of a group of ``size`` ranks ``stride`` apart."""
    g = cluster.gpus_per_node
    per_node = max(1, min(size, g // stride)) if stride < g else 1
    return math.ceil(size / per_node), per_node


@functools.cache
def allreduce_s(size: float, cluster: ClusterSpec, nodes: int, per_node: int) -> float:
    """Seconds of an all-reduce of ``size`` bytes per rank over ``nodes`` x ``per_node`` ranks:
    a ring on NVLink inside one node, else two levels (``estimate.hierarchical_allreduce_time``),
    each ring step paying its link's alpha."""
    if nodes * per_node <= 1 or size == 0:
        return 0.0
    if nodes == 1:
        return estimate.allreduce_time(
            size, per_node, alpha=cluster.alpha_intra_s, bandwidth=cluster.intra_GBps * 1e9
        )
    return estimate.hierarchical_allreduce_time(
        size,
        nodes=nodes,
        gpus_per_node=per_node,
        intra_GBps=cluster.intra_GBps,
        inter_GBps=cluster.inter_GBps,
        alpha_intra=cluster.alpha_intra_s,
        alpha_inter=cluster.alpha_inter_s,
    )


def _link(cluster: ClusterSpec, nodes: int) -> tuple[float, float]:
    """(bytes/s, alpha) of the slowest hop of a ring or exchange over ``nodes`` nodes."""
    if nodes > 1:
        return cluster.inter_GBps * 1e9, cluster.alpha_inter_s
    return cluster.intra_GBps * 1e9, cluster.alpha_intra_s


def tp_comm_s(
    model: ModelSpec, cluster: ClusterSpec, layout: Layout, layers: int, overlap: float
) -> float:
    """Exposed seconds of one micro-batch's tensor-parallel all-reduces on a stage of ``layers``:
    ``estimate.tp_comm_bytes_per_layer``'s payloads (4 of s b h per layer, 6 with full
    recomputation; s the rank's s / cp tokens), each an all-reduce on the link tp spans; half
    as many with a parallel block (PaLM: one all-reduce where a serial block has two)."""
    t = layout.tp
    if t == 1:
        return 0.0
    s, b, h = model.seq // layout.cp, layout.micro_batch, model.hidden
    tp = estimate.tp_comm_bytes_per_layer(s, b, h, t, recompute=layout.recompute)
    payload, calls = int(tp["payload"]), int(tp["payloads"]) // int(tp["payload"])
    if model.parallel_block:  # attention and MLP outputs summed before one all-reduce (PaLM)
        calls //= 2
    one = allreduce_s(payload, cluster, *span(cluster, layout.dims.stride("tp"), t))
    return (1 - overlap) * layers * calls * one


def cp_comm_s(
    model: ModelSpec, cluster: ClusterSpec, layout: Layout, layers: int, overlap: float
) -> float:
    """Exposed seconds of one micro-batch's context-parallel exchanges on a stage of ``layers``:
    ``estimate.cp_comm_bytes_per_layer`` (the K/V bytes a rank sends forward and backward) at the
    pace of the link cp spans, plus alpha per ring step (``estimate.cp_collectives_per_layer``)."""
    c = layout.cp
    if c == 1:
        return 0.0
    sent = estimate.cp_comm_bytes_per_layer(
        model.seq,
        layout.micro_batch,
        model.hidden,
        model.heads,
        c,
        kv_heads=model.kv_heads,
        tp=layout.tp,
        method=layout.cp_method,
    )
    # a ring step per isend; a collective over cp ranks takes cp - 1 steps
    steps = sum(
        n if op == "isend" else (c - 1) * n
        for calls in sent["calls"].values()
        for op, n in calls.items()
        if op != "irecv"
    )
    bw, alpha = _link(cluster, span(cluster, layout.dims.stride("cp"), c)[0])
    return float((1 - overlap) * layers * (sent["sent"] / bw + steps * alpha))


def p2p_s(model: ModelSpec, cluster: ClusterSpec, layout: Layout, overlap: float) -> float:
    """Exposed seconds of one micro-batch's stage-boundary sends (``estimate.
    pipeline_boundary_bytes`` of the rank's s / cp tokens, / tp with sequence parallelism), one
    each way, v times when interleaved: over the network when the stages sit in different
    nodes (tp cp dp >= G), else NVLink; one alpha each."""
    if layout.pp == 1:
        return 0.0
    inner = layout.dims.stride("pp")  # tp cp dp: the ranks of one stage
    bw, alpha = _link(cluster, 2 if inner >= cluster.gpus_per_node else 1)
    boundary = estimate.pipeline_boundary_bytes(
        layout.micro_batch, model.seq // layout.cp, model.hidden
    ) / (layout.tp if layout.sequence_parallel else 1)
    return (1 - overlap) * 2 * layout.virtual_stages * (boundary / bw + alpha)


def _dp_allreduce_s(
    cluster: ClusterSpec, layout: Layout, grads: tuple[int, int], width: int, calls: int
) -> float:
    """Seconds of all-reducing ``width`` bytes per parameter of ``grads`` (dense, routed) in
    ``calls`` equal pieces, each paying its own latency: the dense part over the dp x cp ranks
    that share it, the routed experts over the dp cp / ep ranks that share an expert."""
    group = layout.dp * layout.cp
    dense = span(cluster, layout.dims.stride("cp"), group)  # dp x cp, cp innermost
    split, share = layout.expert_split  # the ranks holding the same experts sit split apart
    expert = span(cluster, split if layout.etp else layout.tp * layout.ep, share)
    return calls * (
        allreduce_s(width * grads[0] / calls, cluster, *dense)
        + allreduce_s(width * grads[1] / calls, cluster, *expert)
    )


def dp_comm_s(
    cluster: ClusterSpec,
    layout: Layout,
    grads: tuple[int, int],
    work_s: float,
    steps: tuple[int, int],
    overlap: float = 1.0,
) -> float:
    """Seconds per step of data-parallel traffic that compute does not hide. ``grads``: (dense,
    routed-expert) parameters of the fullest stage on one rank; ``work_s``: one micro-batch's
    compute and recomputation, of which ``overlap`` can hide traffic; ``steps``:
    (micro-batches, layers of the stage). Traffic goes
    one layer at a time (a bucket or a gather per layer, each paying its latency):

    * ZeRO 0/1: the gradients (``layout.grad_bytes`` each) once per step, bucket by bucket
      behind the last micro-batch's backward (``estimate.ddp_exposed_comm_time``);
    * ZeRO-2: a reduce-scatter (half an all-reduce) after every micro-batch, behind its
      backward;
    * ZeRO-3: also two all-gathers of the bf16 weights per micro-batch, behind its compute."""
    m, layers = steps
    if layout.dp * layout.cp == 1 or sum(grads) == 0:
        return 0.0
    work_s *= overlap
    backward = 2 / 3 * work_s
    reduce = _dp_allreduce_s(cluster, layout, grads, layout.grad_bytes, layers)
    if layout.zero <= 1:
        bare = _dp_allreduce_s(no_latency(cluster), layout, grads, layout.grad_bytes, layers)
        size = layout.grad_bytes * sum(grads)
        return estimate.ddp_exposed_comm_time(
            -(-size // layers),
            grad_bytes=size,
            backward_s=backward,
            alpha=(reduce - bare) / layers,
            beta=bare / size,
        )
    if layout.zero == 2:
        return m * max(0.0, reduce / 2 - backward)
    gathers = _dp_allreduce_s(cluster, layout, grads, 2, layers)  # two halves of an all-reduce
    return m * max(0.0, reduce / 2 + gathers - work_s)
