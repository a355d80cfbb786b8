"""The published-run record (:class:`PublishedRun`) and the runs of mixture-of-experts models and
of PaLM, priced as run: DeepSeek-V3 (FP8, DualPipe, node-limited routing), Qwen3-30B-A3B
(NVIDIA's Megatron-Bridge performance table on DGX-H100), PaLM 540B (multi-query attention and
a parallel block on TPU v4), and DeepSeek-V3 and Qwen3-30B-A3B in bf16 from NVIDIA NeMo
AutoModel's table (a PyTorch-native stack: FSDP2 over the data-parallel ranks, EP over them).
``plan.published`` puts them beside the dense runs. Introduced in
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
    leaves out that explains its residual. ``attention_source``: where the attention kernel the
    layout names (``Layout.attention``) comes from, or that the source does not say and which
    kernel its stack defaulted to."""

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
    attention_source: str = ""

    @property
    def gpus(self) -> int:
        return self.layout.gpus


_BY_SHAPE = DEFAULT_ASSUMPTIONS.replace(matmul_model="by shape")
_BRIDGE = (
    "NVIDIA Megatron-Bridge performance summary, "
    "https://docs.nvidia.com/nemo/megatron-bridge/latest/performance-summary.html, 25.11 NeMo "
    "container, pre-training, System: DGX-H100"
)
_AUTOMODEL = (
    "NVIDIA NeMo AutoModel performance summary, "
    "https://docs.nvidia.com/nemo/automodel/latest/performance/performance-summary.md, "
    "pre-training, System: DGX-H100, Precision: BF16 (Last Updated 2025-10-02 on the page): "
    "mock data, full 4,096-token sequences, a fake balanced gate, Adam, no gradient clipping; "
    "TE + DeepEP kernels"
)
#: what the AutoModel runs' configurations (examples/benchmark/configs/*_te_deepep.yaml, linked
#: from the page) and their stack state, and how the Layout says it
_AUTOMODEL_ASSUMED = (
    "activation_checkpointing: true in the run's config (every layer recomputed, 'full'); FSDP2 "
    "with its MoE parallelizer's default reshard_after_forward=False (each layer's weights stay "
    "gathered from its forward to its backward: the course's ZeRO-2; as ZeRO-3 the step is the "
    "same, the data-parallel traffic hides in both); 16 bytes per parameter (bf16 weights and "
    "gradients, fp32 Adam state); products by shape in bf16; balanced routing (the fake gate), "
    "no node limit; all-to-alls exposed (schedule none: the configs' interleaved 1F1B states no "
    "overlap)"
)
#: the AutoModel runs' attention kernel
_AUTOMODEL_FLASH = (
    "flash: the configs' names and the page say TE (Transformer Engine) kernels, whose "
    "DotProductAttention runs its fused (cuDNN) or flash backend, no score matrix in memory, "
    "wherever the shapes allow (its unfused fallback is for shapes those do not support); with "
    "activation_checkpointing every layer is recomputed besides (full + flash)"
)
_FLASH_NOT_STATED = (
    "not stated by the source; flash, the kernel its stack defaulted to: Megatron-Core's "
    "attention_backend 'auto' picks Transformer Engine's fused or flash attention "
    "(megatron/core/transformer/transformer_config.py, recalled)"
)

MOE_RUNS = [
    PublishedRun(
        "DeepSeek-V3",
        model("DeepSeek-V3"),
        "8xH800 + 400G IB",
        Layout(128, 1, 16, 1, "selective", 1, 1, ep=64, attention="flash"),
        15360 * 4096,
        {"gpu_hours_per_T": 180_000.0},
        "DeepSeek-AI 2024, arXiv:2412.19437, Sec. 1, 2.1.2 and 3.2: 2,048 H800, PP 16, EP 64 "
        "over 8 nodes, ZeRO-1 DP, no TP, FP8 products, DualPipe with 20 of 132 SMs for "
        "communication, each token routed to at most 4 nodes; 180K H800-hours per trillion "
        "tokens; batch 15,360 x 4,096 tokens after the ramp (Sec. 4.2)",
        "micro-batch 1; products by shape (FP8 at the per-tensor _scaled_mm figure); balanced "
        "routing (capacity factor 1); the multi-token-prediction module is not priced",
        "the FP8 speed-up: its products at the bf16 rate bring the row within 5 % "
        "(plan.published.what_if(..., fp8=False)). DeepSeek's FP8 products scale each 1 x 128 "
        "/ 128 x 128 block and promote to fp32 on CUDA cores, slower than the per-tensor "
        "_scaled_mm figure the calibration measured; DualPipe hides all 7.9 s of all-to-alls "
        "behind 10 s of compute here (exposed, the row is 13 % slow)",
        uneven_stages=True,
        assumptions=_BY_SHAPE.replace(
            fp8=True, ep_schedule="DualPipe", ep_node_limit=4, comm_sms=20
        ),
        attention_source="not stated in the paper (Sec. 3.2.3 recomputes RMSNorm and MLA's "
        "up-projections, not the attention core); flash assumed, as every 2024 training stack "
        "ran it; with flash, 'selective' prices as 'none' (nothing more to drop)",
    ),
    PublishedRun(
        "Qwen3-30B-A3B, 16 H100",
        model("Qwen3-30B-A3B"),
        "8xH100 + 400G IB",
        Layout(8, 1, 2, 1, "selective", 2, 24, ep=8, attention="flash"),
        512 * 4096,
        {"tokens_per_gpu_s": 5275.0},
        f"{_BRIDGE}: 16 H100, FP8-CS (per-tensor current scaling), GBS 512, MBS 2, sequence "
        "4,096, FSDP 0, TP 1, PP 2, CP 1, VP 24, EP 8, GA 32; 5,275 tokens/s and 121 model "
        "TFLOP/s per GPU; token distribution force-balanced, dropless",
        "recomputation not stated (selective); ZeRO-1 (Megatron's distributed optimizer); "
        "products by shape; no all-to-all overlap (schedule none)",
        "no term of the planner: NVIDIA's run reaches 15 % MFU; priced with no FP8 speed-up "
        "and every all-to-all exposed it is still 2.5x fast. Its products are priced by shape "
        "(experts at 68 % of the FP8 peak, 16 local experts of 2,048 rows) with the memory-bound "
        "kernels between them; what is left, 11 ms per layer's forward and backward, is what a "
        "model this small pays per kernel and per synchronization (FP8 scaling, permutes, the "
        "all-to-alls of 128 experts, one layer per virtual stage). Not the model's: NeMo "
        "AutoModel ran it in bf16 on 8 H100 at 12,040 tokens/s per GPU, 2.3x this row, and the "
        "planner prices that run within 3 % (its row below)",
        assumptions=_BY_SHAPE.replace(fp8=True),
        attention_source=_FLASH_NOT_STATED,
    ),
    PublishedRun(
        "Qwen3-235B-A22B, 256 H100",
        model("Qwen3-235B-A22B"),
        "8xH100 + 400G IB",
        Layout(16, 2, 8, 1, "selective", 1, 1, ep=32, etp=1, attention="flash"),
        2048 * 4096,
        {"tokens_per_gpu_s": 1575.0},
        f"{_BRIDGE}: 256 H100, FP8-CS, MBS 1, sequence 4,096, FSDP 0, TP 2, PP 8, CP 1, VP 4, "
        "EP 32; 1,575 tokens/s and 233 model TFLOP/s per GPU (the row has one cell fewer than "
        "its header: no GBS, and GA repeats the tokens/s); the H100 recipe "
        "(scripts/performance/configs/qwen/qwen3_workload_base_configs.py, "
        "QWEN3_235B_A22B_PRETRAIN_CONFIG_H100_FP8_CS_V1): GBS 2,048, expert-TP 1, "
        "moe_a2a_overlap True, the alltoall dispatcher",
        "GBS 2,048 from the V1 recipe (its V2 sets 8,192: priced so, the row is 12 % fast); VP 4 "
        "cannot be expressed (94 layers over 8 uneven stages): priced with v 1, so its bubble "
        "(about 1 s of the 20.8 s step) is 4x the run's; recomputation not stated (selective); "
        "ZeRO-1 (Megatron's distributed optimizer); products by shape; the all-to-alls hidden "
        "behind the other micro-batch's attention as moe_a2a_overlap does (1F1B-overlapped)",
        "8 % fast with the all-to-alls overlapped as the recipe runs them, inside the band; "
        "exposed (schedule none) 9 % slow; with its FP8 products at the bf16 rate within 1 %",
        uneven_stages=True,
        assumptions=_BY_SHAPE.replace(fp8=True, ep_schedule="1F1B-overlapped"),
        attention_source=_FLASH_NOT_STATED,
    ),
    PublishedRun(
        "Qwen3-30B-A3B, 8 H100, bf16",
        model("Qwen3-30B-A3B"),
        "8xH100 + 400G IB",
        Layout(8, 1, 1, 2, "full", 4, 1, ep=8, attention="flash"),
        512 * 4096,
        {"step_s": 21.773},
        f"{_AUTOMODEL}: Qwen3 MoE 30B, 8 GPUs, GBS 512, MBS 4, LBS 4, GA 16, sequence 4,096, "
        "TP 1, PP 1, CP 1, EP 8, FSDP 8; 21.773 s per global step, 277 model TFLOP/s and "
        "12,040 tokens/s per GPU",
        _AUTOMODEL_ASSUMED,
        "within 3 % (full recomputation with flash attention, as run); with the eager kernel "
        "it would be 64 % slow, with no layer recomputed 21 % fast. The 3x of the 16-GPU FP8 "
        "row is not this model's",
        assumptions=_BY_SHAPE,
        large=False,  # one node: no band, as Korthikanti et al.'s 22B runs
        extra={"tokens_per_gpu_s": 12040, "model_tflops_per_gpu": 277},
        attention_source=_AUTOMODEL_FLASH,
    ),
    PublishedRun(
        "DeepSeek-V3, 256 H100, bf16",
        model("DeepSeek-V3"),
        "8xH100 + 400G IB",
        Layout(64, 1, 4, 2, "full", 1, 8, ep=64, attention="flash"),
        512 * 4096,
        {"step_s": 8.18},
        f"{_AUTOMODEL}: DeepSeek V3 671B, 256 GPUs, GBS 512, MBS 1, LBS 8, GA 1, sequence "
        "4,096, TP 1, PP 4, CP 1, EP 64, VP 8, FSDP 64; 8.18 s per global step, 250 model "
        "TFLOP/s and 1,002 tokens/s per GPU",
        _AUTOMODEL_ASSUMED,
        "predicted 19 % slow; the term: 4.2 s of the 9.7 s are exposed all-to-alls (schedule "
        "'none'); hidden behind the other micro-batch's attention (1F1B-overlapped) the row is "
        "11 % fast: the run hid part of them, which its configs do not state",
        uneven_stages=True,
        assumptions=_BY_SHAPE,
        extra={"tokens_per_gpu_s": 1002, "model_tflops_per_gpu": 250},
        attention_source=_AUTOMODEL_FLASH,
    ),
    PublishedRun(
        "DeepSeek-V3, 1,024 H100, bf16",
        model("DeepSeek-V3"),
        "8xH100 + 400G IB",
        Layout(256, 1, 4, 2, "full", 1, 8, ep=64, attention="flash"),
        8192 * 4096,
        {"step_s": 37.87},
        f"{_AUTOMODEL}: DeepSeek V3 671B, 1,024 GPUs, GBS 8,192, MBS 1, LBS 8, GA 4, sequence "
        "4,096, TP 1, PP 4, CP 1, EP 64, VP 8, FSDP 256; 37.87 s per global step, 216 model "
        "TFLOP/s and 865 tokens/s per GPU",
        _AUTOMODEL_ASSUMED + "; the Layout runs the rank's 32 sequences as one pipeline round "
        "(the run: GA 4 rounds of 8, four pipeline flushes)",
        "within 1 % (full recomputation with flash attention, as run). The run lost 14 % per "
        "GPU from 256 to 1,024 GPUs (865 against 1,002 tokens/s) at the same local batch; the "
        "planner's rate rises 3 % (the GA-4 flushes and FSDP over 256 ranks are not priced)",
        uneven_stages=True,
        assumptions=_BY_SHAPE,
        extra={"tokens_per_gpu_s": 865, "model_tflops_per_gpu": 216},
        attention_source=_AUTOMODEL_FLASH,
    ),
    PublishedRun(
        "PaLM 540B",
        model("PaLM-540B"),
        "TPU v4 pod",
        Layout(512, 12, 1, 3, "full", 4, 1, attention="eager"),
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
        attention_source="not stated in the paper; eager assumed: XLA's attention on TPU v4 "
        "(2021-22) wrote the scores to memory, FlashAttention (arXiv:2205.14135) came after",
    ),
]
