"""What the planner plans for: a model (:class:`ModelSpec`), a cluster (:class:`ClusterSpec`) and a
layout of the GPUs (:class:`Layout`), with presets taken from the papers and data sheets.

Introduced in notebooks/14_planning_a_run.ipynb.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, TypedDict

from course_lib import validate as _v
from course_lib.measure import estimate
from course_lib.measure.estimate.activations import RECOMPUTE, Recompute
from course_lib.measure.estimate.planning import Norm

__all__ = [
    "ModelSpec",
    "ClusterSpec",
    "Layout",
    "MODELS",
    "CLUSTERS",
    "model",
    "cluster",
    "RECOMPUTE",
    "divisors",
]

# RECOMPUTE (from estimate): the recomputation policies the planner weighs (Korthikanti et al.)


def divisors(n: int) -> list[int]:
    """The positive divisors of ``n``, ascending."""
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer's shape (what the planner needs, nothing more)."""

    name: str
    layers: int  # transformer blocks L
    hidden: int  # model width h
    heads: int  # attention heads a
    kv_heads: int  # key/value heads (= heads for multi-head attention; fewer for GQA)
    ffn: int  # MLP inner width f
    vocab: int  # vocabulary V
    seq_len: int  # training sequence length s
    gated_mlp: bool = True  # SwiGLU (three matrices) instead of GeLU (two)
    bias: bool = False  # linear layers carry biases
    tied_embeddings: bool = False  # output matrix shares the token embedding
    learned_positions: bool = False  # a learned position table of seq_len x h
    norm: Norm = "rmsnorm"  # "rmsnorm" or "layernorm"
    embedding_norm: bool = False  # a norm after the embedding (BLOOM)
    dropout: bool = False  # dropout in training (adds 1-byte masks to activations)
    published_params: float | None = None  # the count the authors report
    source: str = ""  # where the shape and the count come from

    def __post_init__(self) -> None:
        for f in ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "seq_len"):
            _v.count(f, getattr(self, f), minimum=1)
        _v.choice("norm", self.norm, estimate.NORMS)
        if self.hidden % self.heads:
            raise ValueError(f"heads = {self.heads}: expected a divisor of hidden = {self.hidden}")
        if self.heads % self.kv_heads:
            raise ValueError(
                f"kv_heads = {self.kv_heads}: expected a divisor of heads = "
                f"{self.heads}: one of {', '.join(map(str, divisors(self.heads)))}"
            )

    def params(self) -> dict[str, int]:
        """Parameter count by part (``estimate.transformer_param_count``)."""
        return estimate.transformer_param_count(
            layers=self.layers,
            hidden=self.hidden,
            heads=self.heads,
            kv_heads=self.kv_heads,
            ffn=self.ffn,
            vocab=self.vocab,
            seq=self.seq_len,
            gated_mlp=self.gated_mlp,
            bias=self.bias,
            tied_embeddings=self.tied_embeddings,
            learned_positions=self.learned_positions,
            norm=self.norm,
            embedding_norm=self.embedding_norm,
        )

    @property
    def n_params(self) -> int:
        return self.params()["total"]

    def flops_per_token(self, recompute: Recompute = "none") -> tuple[int, int]:
        """(model FLOPs, hardware FLOPs) per trained token. Model FLOPs are what MFU counts, the
        PaLM way (Chowdhery et al. 2022, arXiv:2204.02311, App. B): 6 N + 12 L h s, where N is
        the parameters a matrix product uses (every layer's and the output layer's V h; the
        embedding lookup is not a product). Hardware FLOPs (HFU's count) add what ``recompute``
        runs again (``estimate.recompute_flops_per_token``): a run that recomputes everything
        does about 8 N, so its hardware rate is about 4/3 of its model rate."""
        per_layer = self.params()["per_layer"]
        matmul_params = self.layers * per_layer + self.vocab * self.hidden
        model = estimate.training_flops_per_token(
            matmul_params, layers=self.layers, hidden=self.hidden, seq=self.seq_len
        )
        extra = estimate.recompute_flops_per_token(
            per_layer, layers=self.layers, hidden=self.hidden, seq=self.seq_len, recompute=recompute
        )
        return model, model + extra

    def replace(self, **changes: Any) -> ModelSpec:
        return dataclasses.replace(self, **changes)


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
    ]
}


def model(name: str) -> ModelSpec:
    """A preset from :data:`MODELS` by name."""
    return MODELS[_v.choice("model", name, MODELS)]


@dataclass(frozen=True)
class ClusterSpec:
    """GPUs, their memory and speed, and the links between them (bandwidths per direction)."""

    name: str
    gpus_per_node: int  # GPUs in one node (one NVLink/NVSwitch domain)
    nodes: int  # nodes in the cluster
    memory_bytes: int  # memory per GPU in bytes (80 GB = 80e9)
    peak_flops: float  # dense bf16 peak per GPU in FLOP/s
    intra_GBps: float  # GPU-to-GPU inside a node, per direction, GB/s (1e9 B/s)
    inter_GBps: float  # each GPU's share of the network, per direction, GB/s
    source: str = ""

    def __post_init__(self) -> None:
        _v.count("gpus_per_node", self.gpus_per_node, minimum=1)
        _v.count("nodes", self.nodes, minimum=1)
        _v.count("memory_bytes", self.memory_bytes, minimum=1)
        for f in ("peak_flops", "intra_GBps", "inter_GBps"):
            _v.number(f, getattr(self, f), positive=True, finite=True)

    @property
    def gpus(self) -> int:
        return self.gpus_per_node * self.nodes

    def with_gpus(self, gpus: int) -> "ClusterSpec":
        """The same hardware with ``gpus`` GPUs (whole nodes, or part of one node)."""
        n = _v.count("gpus", gpus, minimum=1)
        if n <= self.gpus_per_node:
            if self.gpus_per_node % n:
                raise ValueError(
                    f"gpus = {n}: expected a divisor of gpus_per_node = "
                    f"{self.gpus_per_node} or a multiple of it"
                )
            return dataclasses.replace(self, gpus_per_node=n, nodes=1)
        if n % self.gpus_per_node:
            raise ValueError(
                f"gpus = {n}: expected a multiple of gpus_per_node = {self.gpus_per_node}"
            )
        return dataclasses.replace(self, nodes=n // self.gpus_per_node)


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


@dataclass(frozen=True)
class Layout:
    """How a run uses its GPUs: dp x tp x pp ranks, and what each does to save memory."""

    dp: int  # data-parallel replicas
    tp: int = 1  # tensor-parallel ranks (Megatron column/row split)
    pp: int = 1  # pipeline stages
    zero: int = 1  # ZeRO stage over the dp ranks: 0 (DDP), 1, 2, 3 (FSDP)
    recompute: Recompute = "selective"  # none, selective (attention core; FlashAttention), full
    micro_batch: int = 1  # sequences per micro-batch
    virtual_stages: int = 1  # interleaved pipeline: chunks per rank (v)
    sequence_parallel: bool = True  # split LayerNorm/dropout activations over tp too

    def __post_init__(self) -> None:
        for f in ("dp", "tp", "pp", "micro_batch", "virtual_stages"):
            _v.count(f, getattr(self, f), minimum=1)
        _v.choice("zero", self.zero, (0, 1, 2, 3))
        _v.choice("recompute", self.recompute, RECOMPUTE)

    @property
    def gpus(self) -> int:
        return self.dp * self.tp * self.pp
