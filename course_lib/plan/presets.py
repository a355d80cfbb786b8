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

__all__ = ["MODELS", "CLUSTERS", "model", "cluster", "this_machine"]


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
            published_params=671e9,
            source="DeepSeek-AI 2024, arXiv:2412.19437, Sec. 4.2 (61 layers, width 7168, 128 "
            "heads, 3 dense layers, then 1 shared + 256 routed experts of width 2048, 8 active; "
            "4K pre-training sequences); dense FFN 18,432 and vocabulary 129,280 from the "
            "released config. Its multi-head latent attention is priced here as plain multi-head "
            "attention of width 7168 (about 10 % more attention weights than MLA's, and MLA's "
            "192-wide query-key heads do about 3x the 12 L h s attention FLOPs counted)",
        ),
    ]
}


def model(name: str) -> ModelSpec:
    """A preset from :data:`MODELS` by name."""
    return MODELS[_v.choice("model", name, MODELS)]


_H100 = (
    "NVIDIA H100 SXM data sheet: 80 GB HBM3, 989 TFLOP/s dense bf16, NVLink 4 900 GB/s "
    "(450 per direction); one ConnectX-7 400 Gb/s (50 GB/s) NIC per GPU as in DGX H100"
)
_A100 = (
    "NVIDIA A100 SXM 80GB data sheet: 312 TFLOP/s dense bf16, NVLink 3 600 GB/s (300 per "
    "direction); one HDR 200 Gb/s (25 GB/s) NIC per GPU as in DGX A100"
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
            estimate.link_speed("NVLink H100").per_direction_GBps,
            estimate.link_speed("InfiniBand NDR").per_direction_GBps,
            _H100,
        ),
        ClusterSpec(
            "8xA100-80GB + 200G IB",
            8,
            1,
            80 * 10**9,
            312e12,
            estimate.link_speed("NVLink A100").per_direction_GBps,
            estimate.link_speed("InfiniBand HDR").per_direction_GBps,
            _A100,
        ),
        ClusterSpec(
            "8xV100-32GB + 100GbE",
            8,
            1,
            32 * 10**9,
            125e12,
            150.0,
            estimate.link_speed("100 GbE").per_direction_GBps,
            "NVIDIA V100 SXM2 data sheet: 125 TFLOP/s fp16 tensor, NVLink 2 300 GB/s",
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
            "peak as the H100 SXM's 989 TFLOP/s",
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
