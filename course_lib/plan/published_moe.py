"""The published-run record (:class:`PublishedRun`) and the runs of mixture-of-experts models and
of PaLM, priced as run: DeepSeek-V3 (FP8, DualPipe, node-limited routing), Qwen3-30B-A3B
(NVIDIA's Megatron-Bridge performance table on DGX-H100), PaLM 540B (multi-query attention and
a parallel block on TPU v4). ``plan.published`` puts them beside the dense runs. Introduced in
notebooks/14_planning_a_run.ipynb.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from course_lib.plan.comm_model import DEFAULT_ASSUMPTIONS, Assumptions
from course_lib.plan.presets import model
from course_lib.plan.specs import Layout, ModelSpec

__all__ = ["PublishedRun", "MOE_RUNS"]


@dataclass(frozen=True)
class PublishedRun:
    """One run as published. ``printed``: what the paper printed about speed, in its own metric:
    ``mfu`` (model FLOPs, the PaLM count), ``hardware_tflops`` (per GPU, recomputation
    counted), ``step_s`` (seconds per step), ``gpu_hours_per_T`` (GPU-hours per trillion
    tokens) or ``tokens_per_gpu_s`` (tokens per second per GPU). ``why``: what the planner
    leaves out that explains its residual."""

    name: str
    model: ModelSpec
    cluster: str
    layout: Layout
    global_batch_tokens: int
    printed: dict[str, float]
    source: str
    assumed: str = ""
    why: str = ""
    uneven_stages: bool = False
    assumptions: Assumptions = DEFAULT_ASSUMPTIONS
    large: bool = True  # one of the large runs, held to +/-15 %
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def gpus(self) -> int:
        return self.layout.gpus


_BY_SHAPE = DEFAULT_ASSUMPTIONS.replace(matmul_model="by shape")
_BRIDGE = (
    "NVIDIA Megatron-Bridge performance summary, DGX-H100 pre-training table (recalled, not "
    "checked against the page while this was written)"
)

MOE_RUNS = [
    PublishedRun(
        "DeepSeek-V3",
        model("DeepSeek-V3"),
        "8xH800 + 400G IB",
        Layout(128, 1, 16, 1, "selective", 1, 1, ep=64),
        15360 * 4096,
        {"gpu_hours_per_T": 180_000.0},
        "DeepSeek-AI 2024, arXiv:2412.19437, Sec. 1, 2.1.2 and 3.2: 2,048 H800, PP 16, EP 64 "
        "over 8 nodes, ZeRO-1 DP, no TP, FP8 products, DualPipe with 20 of 132 SMs for "
        "communication, each token routed to at most 4 nodes; 180K H800-hours per trillion "
        "tokens; batch 15,360 x 4,096 tokens after the ramp (Sec. 4.2)",
        "micro-batch 1; products by shape (FP8 at the per-tensor _scaled_mm figure); balanced "
        "routing (capacity factor 1); the multi-token-prediction module is not priced",
        "predicted fast: DualPipe hides every all-to-all here (7.9 s of them behind 10 s of "
        "compute); DeepSeek's FP8 products scale each 1 x 128 / 128 x 128 block and promote "
        "to fp32 on CUDA cores (slower than the per-tensor figure the calibration measured), "
        "the routing is balanced per sequence, not per step, and DualPipe's bubble is smaller "
        "than the 1F1B bubble charged here",
        uneven_stages=True,
        assumptions=_BY_SHAPE.replace(
            fp8=True, ep_schedule="DualPipe", ep_node_limit=4, comm_sms=20
        ),
    ),
    PublishedRun(
        "Qwen3-30B-A3B, 16 H100",
        model("Qwen3-30B-A3B"),
        "8xH100 + 400G IB",
        Layout(8, 1, 2, 1, "selective", 1, 24, ep=8),
        512 * 4096,
        {"tokens_per_gpu_s": 5275.0},
        f"{_BRIDGE}: 16 H100, TP 1, PP 2, VP 24, EP 8, FP8, 5,275 tokens/s per GPU",
        "global batch 512 x 4,096 tokens and micro-batch 1 (the table's usual settings, "
        "recalled); ZeRO-1 (Megatron's distributed optimizer); products by shape; no "
        "all-to-all overlap (schedule none); balanced routing",
        "predicted 3x fast: NVIDIA's run reaches 15 % MFU; the planner prices each of its "
        "products by shape (experts at 68 % of the FP8 peak, 16 local experts of 2,048 rows) "
        "and the memory-bound kernels between them, and leaves out what a model this small "
        "pays per kernel: launches and FP8 scaling kernels around every product, one layer "
        "per virtual stage (VP 24), the permute / all-to-all synchronization of 128 experts",
        assumptions=_BY_SHAPE.replace(fp8=True),
    ),
    PublishedRun(
        "PaLM 540B",
        model("PaLM-540B"),
        "TPU v4 pod",
        Layout(512, 12, 1, 3, "full", 4, 1),
        2048 * 2048,
        {"mfu": 0.462},
        "Chowdhery et al. 2022, arXiv:2204.02311, Sec. 4 and Table 3: 6,144 TPU v4 in two "
        "pods, 12-way model parallelism and 256-way fully sharded data parallelism in each pod, "
        "data parallelism across the two; MFU 46.2 % (HFU 57.8 % with rematerialization); "
        "batch 2,048 x 2,048 tokens at the end of its ramp (Sec. 5)",
        "full rematerialization (HFU / MFU = 1.25 in the paper; full recomputation counts "
        "1.33); the whole replica's 4 sequences in one micro-batch; ZeRO-3 for fully sharded "
        "data parallelism; activations sharded over the model-parallel ranks as sequence "
        "parallelism shards them (GSPMD's 2-D sharding); products by shape with the H100's "
        "measured GEMM ceiling (no TPU figure here) on TPU v4's peak and HBM, no SM waves",
        "within the band: model FLOPs at the GEMM ceiling measured on an H100 (no TPU v4 "
        "figure), one all-reduce per parallel block",
        assumptions=_BY_SHAPE,
    ),
]
