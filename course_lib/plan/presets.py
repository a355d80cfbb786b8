"""The planner's presets: models from their papers (dense and mixture of experts) and clusters
from the data sheets, looked up by name (:func:`model`, :func:`cluster`), and this machine as a
one-device cluster (:func:`this_machine`). Introduced in notebooks/14_planning_a_run.ipynb.
"""

from __future__ import annotations

from typing import TypedDict

from course_lib import validate as _v
from course_lib.measure import estimate
from course_lib.measure.estimate.planning import Norm
from course_lib.plan.specs import ClusterSpec, ModelSpec

__all__ = ["MODELS", "CLUSTERS", "NVLINK_NCCL_FRACTION", "model", "cluster", "this_machine"]


class _Shape(TypedDict):
    gated_mlp: bool
    bias: bool
    norm: Norm
    tied_embeddings: bool


_GPT: _Shape = {"gated_mlp": False, "bias": True, "norm": "layernorm", "tied_embeddings": True}
MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in [
        ModelSpec(
            "Llama-2-7B",
            32,
            4096,
            32,
            32,
            11008,
            32000,
            4096,
            published_params=6_738_415_616,
            source="Touvron et al. 2023, arXiv:2307.09288 (Table 1; count of the released "
            "checkpoint)",
        ),
        ModelSpec(
            "Llama-2-70B",
            80,
            8192,
            64,
            8,
            28672,
            32000,
            4096,
            published_params=68_976_648_192,
            source="Touvron et al. 2023, arXiv:2307.09288 (GQA with 8 KV heads)",
        ),
        ModelSpec(
            "Llama-3-405B",
            126,
            16384,
            128,
            8,
            53248,
            128256,
            8192,
            published_params=405_853_388_800,
            source="Llama Team 2024, The Llama 3 Herd of Models, arXiv:2407.21783, Table 3",
        ),
        ModelSpec(
            "GPT-3-175B",
            96,
            12288,
            96,
            96,
            4 * 12288,
            50257,
            2048,
            learned_positions=True,
            dropout=True,
            published_params=175.0e9,
            **_GPT,
            source="Brown et al. 2020, arXiv:2005.14165, Table 2.1",
        ),
        ModelSpec(
            "BLOOM-176B",
            70,
            14336,
            112,
            112,
            4 * 14336,
            250880,
            2048,
            embedding_norm=True,
            dropout=False,
            published_params=176_247_271_424,
            **_GPT,
            source="BigScience 2022, arXiv:2211.05100, Table 3 and Sec. 3.4",
        ),
        ModelSpec(
            "MT-NLG-530B",
            105,
            20480,
            128,
            128,
            4 * 20480,
            50257,
            2048,
            learned_positions=True,
            dropout=True,
            published_params=530e9,
            **_GPT,
            source="Smith et al. 2022, arXiv:2201.11990, Sec. 3",
        ),
        ModelSpec(
            "Mixtral-8x7B",
            32,
            4096,
            32,
            8,
            14336,
            32000,
            4096,
            experts=8,
            top_k=2,
            expert_ffn=14336,
            published_params=46.7e9,
            published_active=12.9e9,
            source="Jiang et al. 2024, arXiv:2401.04088, Table 1 (46.7B total, 12.9B active: "
            "Mistral AI's announcement); the training sequence length is not published (4,096 "
            "here; the model serves 32K)",
        ),
        ModelSpec(
            "DeepSeek-V3",
            61,
            7168,
            128,
            128,
            18432,
            129280,
            4096,
            experts=256,
            top_k=8,
            shared_experts=1,
            expert_ffn=2048,
            dense_layers=3,
            head_dim=128,
            q_lora_rank=1536,
            kv_lora_rank=512,
            rope_head_dim=64,
            v_head_dim=128,
            published_params=671e9,
            published_active=37e9,
            source="DeepSeek-AI 2024, arXiv:2412.19437, Sec. 1 and 4.2 (61 layers, width 7168; "
            "MLA with 128 heads of 128, KV compression 512, query compression 1536, decoupled "
            "RoPE 64 per head; 3 dense layers, then 1 shared + 256 routed experts of width 2048, "
            "8 active; 4K pre-training sequences; 671B total, 37B activated, the multi-token "
            "prediction module left out); dense FFN 18,432 and vocabulary 129,280 from the "
            "released config",
        ),
        ModelSpec(
            "Qwen3-30B-A3B",
            48,
            2048,
            32,
            4,
            6144,
            151936,
            4096,
            experts=128,
            top_k=8,
            expert_ffn=768,
            head_dim=128,
            qk_norm=True,
            published_params=30.5e9,
            published_active=3.3e9,
            source="Qwen Team 2025, Qwen3 Technical Report, arXiv:2505.09388, Table 2 and the "
            "Qwen3-30B-A3B model card (48 layers, 32 query and 4 K/V heads of 128 with QK-norm, "
            "128 experts of width 768, 8 active, no shared expert; 30.5B total, 3.3B "
            "activated); width 2,048, vocabulary 151,936 and untied embeddings from the "
            "released config (recalled); every layer is MoE (ffn is unused); 4K pre-training "
            "sequences (Sec. 3.2, stage 1)",
        ),
        ModelSpec(
            "Qwen3-235B-A22B",
            94,
            4096,
            64,
            4,
            12288,
            151936,
            4096,
            experts=128,
            top_k=8,
            expert_ffn=1536,
            head_dim=128,
            qk_norm=True,
            published_params=235e9,
            published_active=22e9,
            source="Qwen Team 2025, arXiv:2505.09388, Table 2 and the Qwen3-235B-A22B model "
            "card (94 layers, 64 query and 4 K/V heads of 128 with QK-norm: heads x head_dim "
            "= 8,192 on a width of 4,096; 128 experts of width 1,536, 8 active; 235B total, "
            "22B activated); width, vocabulary and untied embeddings from the released config "
            "(recalled); every layer is MoE (ffn is unused)",
        ),
        ModelSpec(
            "PaLM-540B",
            118,
            18432,
            48,
            1,
            4 * 18432,
            256000,
            2048,
            head_dim=256,
            parallel_block=True,
            tied_embeddings=True,
            published_params=540.35e9,
            source="Chowdhery et al. 2022, PaLM, arXiv:2204.02311, Sec. 2 and Table 1 (118 "
            "layers, d_model 18,432, 48 heads of 256, multi-query attention, SwiGLU of 4 "
            "d_model, parallel layers, RoPE, shared input-output embeddings, no biases, a "
            "256K-token vocabulary, 2,048-token sequences; 540.35B parameters)",
        ),
    ]
}


def model(name: str) -> ModelSpec:
    """A preset from :data:`MODELS` by name."""
    return MODELS[_v.choice("model", name, MODELS)]


#: the share of NVLink's line rate NCCL's collectives carry: "450GB/s is the line rate. With the
#: protocol overhead (~20%) NCCL can get an effective NVLink bandwidth of 370GB/s" (S. Jeaugey,
#: NCCL, github.com/NVIDIA/nccl-tests/issues/212, 2024); on 8 A100s nccl-tests users report
#: 200-230 GB/s of all-reduce bus bandwidth against 300 (nccl-tests issues 149 and 178). The
#: NVLink presets below run at 0.8 x their data sheet; the network links, whose reports sit near
#: line rate, and the H800's 160 GB/s (DeepSeek's own achieved figure) at what they state
NVLINK_NCCL_FRACTION = 0.8
_NVLINK = (
    "; NVLink priced at 0.8 of its line rate, what NCCL reaches after its protocol overhead "
    "(NVLINK_NCCL_FRACTION)"
)
_H100 = (
    "NVIDIA H100 SXM data sheet: 80 GB HBM3 (3.35 TB/s), 989 TFLOP/s dense bf16 (1,979 FP8), "
    "NVLink 4 900 GB/s "
    "(450 per direction); one ConnectX-7 400 Gb/s (50 GB/s) NIC per GPU as in DGX H100" + _NVLINK
)
_A100 = (
    "NVIDIA A100 SXM 80GB data sheet: 312 TFLOP/s dense bf16, HBM2e 2.04 TB/s, NVLink 3 600 "
    "GB/s (300 per "
    "direction); one HDR 200 Gb/s (25 GB/s) NIC per GPU as in DGX A100" + _NVLINK
)
CLUSTERS: dict[str, ClusterSpec] = {
    c.name: c
    for c in [
        ClusterSpec(
            "8xH100 + 400G IB",
            8,
            1,
            80 * 10**9,
            989e12,
            estimate.link_speed("NVLink H100").per_direction_GBps * NVLINK_NCCL_FRACTION,
            estimate.link_speed("InfiniBand NDR").per_direction_GBps,
            _H100,
            mem_GBps=3350.0,
            fp8_peak_flops=1979e12,
        ),
        ClusterSpec(
            "8xA100-80GB + 200G IB",
            8,
            1,
            80 * 10**9,
            312e12,
            estimate.link_speed("NVLink A100").per_direction_GBps * NVLINK_NCCL_FRACTION,
            estimate.link_speed("InfiniBand HDR").per_direction_GBps,
            _A100,
            mem_GBps=2039.0,
            sms=108,
        ),
        ClusterSpec(
            "8xV100-32GB + 100GbE",
            8,
            1,
            32 * 10**9,
            125e12,
            150.0 * NVLINK_NCCL_FRACTION,
            estimate.link_speed("100 GbE").per_direction_GBps,
            "NVIDIA V100 SXM2 data sheet: 125 TFLOP/s fp16 tensor, NVLink 2 300 GB/s (150 per "
            "direction), HBM2 900 GB/s" + _NVLINK,
            mem_GBps=900.0,
            sms=80,
        ),
        ClusterSpec(
            "8xH800 + 400G IB",
            8,
            1,
            80 * 10**9,
            989e12,
            160.0,
            estimate.link_speed("InfiniBand NDR").per_direction_GBps,
            "DeepSeek-AI 2024, arXiv:2412.19437, Sec. 3.1 and 3.2.2: 8 H800 per node on NVLink "
            "(about 160 GB/s achievable) and 400 Gb/s InfiniBand (50 GB/s) per GPU; dense bf16 "
            "peak as the H100 SXM's 989 TFLOP/s (FP8 1,979), HBM3 3.35 TB/s",
            mem_GBps=3350.0,
            fp8_peak_flops=1979e12,
        ),
        ClusterSpec(
            "TPU v4 pod",
            3072,
            1,
            32 * 10**9,
            275e12,
            135.0,
            12.5,
            "Jouppi et al. 2023, TPU v4, arXiv:2304.01433 (275 TFLOP/s bf16, 32 GB HBM, six "
            "ICI links of 50 GB/s in a 3-D torus: about 135 GB/s per direction for a ring on "
            "one axis pair, recalled) and Chowdhery et al. 2022, arXiv:2204.02311 Sec. 4 (3,072 "
            "chips per pod, two pods joined over the data-center network: 12.5 GB/s per chip "
            "assumed). A 'node' here is one pod (its ICI torus); HBM 1.2 TB/s",
            mem_GBps=1200.0,
            sms=0,
        ),
    ]
}


def cluster(name: str, *, gpus: int | None = None) -> ClusterSpec:
    """A preset from :data:`CLUSTERS` (one node), or ``"this machine"``; ``gpus`` resizes it."""
    if name == "this machine":
        c = this_machine()
    else:
        c = CLUSTERS[_v.choice("cluster", name, [*CLUSTERS, "this machine"])]
    return c if gpus is None else c.with_gpus(gpus)


def this_machine() -> ClusterSpec:
    """This computer as a one-device cluster: the GPU if there is one (its memory; a bf16 matmul
    timed for the peak), else the CPU (physical memory; an fp32 matmul timed). Links: nominal
    PCIe 4.0 (there is nothing to link to). The peak is *measured*, so it is below the data sheet."""
    import os
    import time

    import torch

    if torch.cuda.is_available():
        dev, dtype, n = torch.device("cuda"), torch.bfloat16, 4096
        memory = torch.cuda.get_device_properties(0).total_memory
        name = torch.cuda.get_device_name(0)
    else:
        dev, dtype, n = torch.device("cpu"), torch.float32, 512
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        name = "CPU"
    a = torch.randn(n, n, device=dev, dtype=dtype)
    best = float("inf")
    for _ in range(4):
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        a @ a
        if dev.type == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    pcie = estimate.link_speed("PCIe 4.0 x16").per_direction_GBps
    return ClusterSpec(
        f"this machine ({name})",
        1,
        1,
        int(memory),
        2 * n**3 / best,
        pcie,
        pcie,
        "measured here: total memory, and one timed matmul for the peak",
    )
