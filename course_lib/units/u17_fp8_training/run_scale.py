"""Unit 17, at real sizes: what FP8 can speed up in a Llama 3 step (an Amdahl model on the
H100 datasheet's peaks, beside the end-to-end speedups torchao reports), FSDP bytes and memory
per GPU at 70B, and DeepSeek-V3's FP8 dispatch. Nothing here is measured: every speed is the
datasheet's or a report's, labelled so.

Used by notebooks/17_fp8_training.ipynb through :mod:`run` (which re-exports these names).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from course_lib import kit, validate
from course_lib.measure import estimate


@dataclass(frozen=True)
class Shape:
    """A dense decoder's shape (Llama Team 2024, arXiv:2407.21783, Table 3)."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int


LLAMA3 = (
    Shape("Llama-3-8B", 32, 4096, 32, 8, 14336, 128256),
    Shape("Llama-3-70B", 80, 8192, 64, 8, 28672, 128256),
    Shape("Llama-3-405B", 126, 16384, 128, 8, 53248, 128256),
)

#: end-to-end speedups over bf16 reported by torchao's docs (docs/source/workflows/training.md,
#: "e2e training benchmarks", pytorch/ao at commit 36027d8): torchtitan, Llama3-8B on 8 H100,
#: batch 1, sequence 8192, torch.compile, FSDP2; tokens/s 6150 (bf16), 7689.5 (tensorwise with
#: float8 all-gather), 6768 (rowwise with bf16 all-gather)
REPORTED = {
    ("Llama-3-8B", "tensorwise"): 7689.5 / 6150,
    ("Llama-3-8B", "rowwise"): 6768 / 6150,
}


@dataclass(frozen=True)
class SpeedupRow:
    """:func:`speedup_table`: one Llama 3 size (its ``other`` column is named with the share)."""

    model: str
    linear_share: float = field(metadata=kit.column("linear share of FLOPs"))
    all_in_gemms: float = field(metadata=kit.column("speedup, all time in GEMMs"))
    other: float = field(metadata=kit.column("speedup, other time outside GEMMs"))
    reported_tensorwise: float | None = field(metadata=kit.column("reported, tensorwise"))
    reported_rowwise: float | None = field(metadata=kit.column("reported, rowwise"))


@dataclass(frozen=True)
class FsdpRow:
    """:func:`fsdp_table`: one Llama 3 size under FSDP with one gather precision."""

    model: str
    gather: str
    params: int
    sent_GB: float = field(metadata=kit.column("all-gather sent per step (GB)"))
    states_GiB: float = field(metadata=kit.column("model states per GPU (GiB)"))
    largest_GiB: float = field(metadata=kit.column("largest layer gathered (GiB)"))


@dataclass(frozen=True)
class PeakMatmulRow:
    """:func:`peak_matmul_table`: one model's matmul GPU-seconds at the datasheet's peaks."""

    model: str
    active_B: float = field(metadata=kit.column("activated params (billions)"))
    gflop_per_token: float = field(metadata=kit.column("GFLOP per token (6N)"))
    bf16_s: float = field(metadata=kit.column("GPU-s at bf16 peak"))
    fp8_s: float = field(metadata=kit.column("GPU-s at FP8 peak"))


@dataclass(frozen=True)
class DispatchRow:
    """:func:`dispatch_table`: one token's dispatch in one precision (``copies``: named with
    the count)."""

    dispatch_in: str = field(metadata=kit.column("dispatch in"))
    per_copy: int = field(metadata=kit.column("bytes per copy"))
    copies: int = field(metadata=kit.column("bytes for the copies"))


def speedup_table(*, seq: int = 8192, other_time: float = 0.3) -> pd.DataFrame:
    """Per Llama 3 size: the share of training FLOPs in the layers' linear GEMMs
    (``estimate.linear_flops_fraction``), the step speedup if the whole step ran at peak and
    FP8 doubled the GEMMs (H100: 1,979 vs 989 TFLOP/s dense), the same when ``other_time`` of the
    bf16 step is spent outside GEMMs (norms, softmax, elementwise, exposed communication: an
    assumption, not a measurement), and the speedups torchao reports where there are any."""
    seq = validate.count("seq", seq, minimum=1)
    other = validate.number("other_time", other_time, minimum=0.0, maximum=1.0)
    ratio = estimate.H100_PEAK_FLOPS["fp8"] / estimate.H100_PEAK_FLOPS["bf16"]
    rows = []
    for s in LLAMA3:
        f = estimate.linear_flops_fraction(
            layers=s.layers, hidden=s.hidden, seq=seq, ffn=s.ffn, heads=s.heads,
            kv_heads=s.kv_heads, vocab=s.vocab,
        )  # fmt: skip
        speedups = [
            estimate.fp8_step_speedup(g, matmul_speedup=ratio) for g in (f, f * (1 - other))
        ]
        reported = [REPORTED.get((s.name, scaling)) for scaling in ("tensorwise", "rowwise")]
        rows.append(SpeedupRow(s.name, f, *speedups, *reported))
    named = {"speedup, other time outside GEMMs": f"speedup, {other:.0%} outside GEMMs"}
    return kit.frame(rows, SpeedupRow).rename(columns=named)


def fsdp_table(*, world_size: int = 64) -> pd.DataFrame:
    """Per Llama 3 size under FSDP on ``world_size`` GPUs: all-gather bytes each GPU sends per
    step (``estimate.fsdp_allgather_bytes_sent``; FP8 for the layers' linear weights, bf16 for
    embeddings, norms and the head) and model-state memory per GPU
    (``estimate.fsdp_fp8_memory_per_gpu``: fp32 master, gradients, Adam, plus the largest layer
    gathered), for a bf16 and an FP8 gather. Counts from ``estimate.transformer_param_count``."""
    n = validate.count("world_size", world_size, minimum=1)
    rows = []
    for s in LLAMA3:
        counts = estimate.transformer_param_count(
            layers=s.layers, hidden=s.hidden, heads=s.heads, kv_heads=s.kv_heads, ffn=s.ffn,
            vocab=s.vocab,
        )  # fmt: skip
        k = s.kv_heads * s.hidden // s.heads
        linear_per_layer = 2 * s.hidden * s.hidden + 2 * s.hidden * k + 3 * s.hidden * s.ffn
        linear = s.layers * linear_per_layer
        other = counts["total"] - linear
        for gather in ("bf16", "fp8"):
            sent = estimate.fsdp_allgather_bytes_sent(
                linear_params=linear, other_params=other, world_size=n, gather=gather
            )
            mem = estimate.fsdp_fp8_memory_per_gpu(
                counts["total"], n, largest_layer_params=linear_per_layer, gather=gather
            )
            gib = mem["sharded"] / 2**30, mem["gathered"] / 2**30
            rows.append(FsdpRow(s.name, gather, counts["total"], sent / 1e9, *gib))
    return kit.frame(rows, FsdpRow)


#: activated parameters per token used for 6N training FLOPs: Llama-3-70B's count from its
#: shape (all dense), DeepSeek-V3's 37B activated of 671B (DeepSeek-AI 2024, arXiv:2412.19437,
#: abstract)
ACTIVE_PARAMS = {"Llama-3-70B": 70_553_706_496, "DeepSeek-V3": 37e9}


def peak_matmul_table(*, tokens: float = 1e6) -> pd.DataFrame:
    """GPU-seconds of matmul per ``tokens`` trained, 6 N FLOPs per token (N activated
    parameters, shown in billions; the FLOPs in GFLOP), at the H100's dense bf16 and FP8 peaks:
    the best any step could do, from the datasheet. Real steps run at 30-45 % of peak (MFU,
    unit 14)."""
    t = validate.number("tokens", tokens, positive=True)
    rows = []
    for model, n in ACTIVE_PARAMS.items():
        flops = 6 * n * t
        peaks = estimate.H100_PEAK_FLOPS
        rows.append(
            PeakMatmulRow(model, n / 1e9, 6 * n / 1e9, flops / peaks["bf16"], flops / peaks["fp8"])
        )
    return kit.frame(rows, PeakMatmulRow)


#: DeepSeek-V3 (DeepSeek-AI 2024, arXiv:2412.19437): hidden size 7168, 8 routed experts per
#: token; its dispatch all-to-all carries FP8 activations with 1 x 128 tile scales
DEEPSEEK_V3_HIDDEN = 7168


def dispatch_table(*, hidden: int = DEEPSEEK_V3_HIDDEN, copies: int = 8) -> pd.DataFrame:
    """Bytes one token's activation takes to the experts in the MoE dispatch (``copies`` of it,
    one per routed expert, an upper bound: copies bound for one node can be sent once), in bf16
    and in FP8 with one fp32 scale per 1 x 128 tile (``estimate.fp8_cast_bytes``)."""
    h = validate.count("hidden", hidden, minimum=1)
    c = validate.count("copies", copies, minimum=1)
    bf16 = 2 * h
    fp8 = estimate.fp8_cast_bytes(1, h, scaling="blockwise", block=128)
    rows = [DispatchRow("bf16", bf16, c * bf16), DispatchRow("fp8 + 1x128 scales", fp8, c * fp8)]
    return kit.frame(rows).rename(columns={"bytes for the copies": f"bytes for {c} copies"})
