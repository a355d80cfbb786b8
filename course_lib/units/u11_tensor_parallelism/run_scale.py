"""Unit 11's formulas at scale (notebooks/11_tensor_parallelism.ipynb, sections 6, 8 and 9):
Korthikanti et al.'s activation formulas, a Llama-7B / 70B layer split over tp ranks, and the
sources' numbers recomputed. Everything here goes through ``measure.estimate``; nothing runs
on ranks. Re-exported by ``run.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd
import torch

from course_lib import kit, validate
from course_lib.measure import estimate
from course_lib.parallel.tensor import check_tp
from course_lib.shape import ModelShape

__all__ = [
    "activation_formulas",
    "LLAMA_7B",
    "LLAMA_70B",
    "H100_BF16_FLOPS",
    "UTILIZATION",
    "scale_table",
    "source_check",
    "source_bytes",
]


# --------------------------------------------------------------------------------------------
# formulas and scale
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class FormulaRow:
    """One tp of :func:`activation_formulas` (bytes of one layer's activations)."""

    tp: int
    tensor_parallel: float  # estimate, tensor parallelism alone
    paper_tp: float  # the paper's closed form of the same
    sequence_parallel: float  # estimate, with sequence parallelism
    paper_sp: float


def activation_formulas(
    seq: int = 2048,
    batch: int = 1,
    hidden: int = 4096,
    heads: int = 32,
    tps: Sequence[int] = (1, 2, 4, 8),
) -> pd.DataFrame:
    """Korthikanti et al.'s per-layer activation bytes (16-bit, dropout masks) without tensor
    parallelism, with it, and with sequence parallelism, beside the closed forms of the paper
    (34sbh + 5as^2b; sbh(10 + 24/t + 5as/(ht)); sbh(34/t + 5as/(ht))). Bytes."""
    sizes = validate.counts("tps", tps, minimum=1)
    s, b, h, a = seq, batch, hidden, heads
    rows = []
    for t in sizes:
        paper_tp = (
            s * b * h * (10 + 24 / t + 5 * a * s / (h * t))
            if t > 1
            else s * b * h * (34 + 5 * a * s / h)
        )
        rows.append(
            FormulaRow(
                t,
                estimate.activation_bytes_transformer_layer(s, b, h, a, tp=t),
                paper_tp,
                estimate.activation_bytes_transformer_layer(
                    s, b, h, a, tp=t, sequence_parallel=True
                ),
                s * b * h * (34 / t + 5 * a * s / (h * t)),
            )
        )
    return kit.frame(rows, FormulaRow)


#: Llama-7B (Touvron et al. 2023): 32 layers, width 4096, 32 heads, SwiGLU 11008, 2,048 tokens
LLAMA_7B = ModelShape("Llama-7B", 32, 4096, 32, 32, 11008, 32000, seq=2048)
#: Llama-2-70B (Touvron et al. 2023b): 80 layers, width 8192, 64 heads, 8 KV heads (grouped-query
#: attention), SwiGLU 28672, 4,096 tokens
LLAMA_70B = ModelShape("Llama-2-70B", 80, 8192, 64, 8, 28672, 32000, seq=4096)


H100_BF16_FLOPS = 989e12  #: H100 SXM dense bf16 peak (NVIDIA's datasheet), FLOP/s
UTILIZATION = 0.5  #: the fraction of peak a well-tuned layer reaches (an assumption)


@dataclass(frozen=True)
class LayerScaleRow:
    """One shape and tp of :func:`scale_table` (bytes; seconds); the frame adds one
    ``comm_s_per_layer <link>`` column per link."""

    model: str
    tp: int
    layer_params_per_rank: int
    state_bytes: int
    activations_tp: float
    activations_sp: float
    allreduce_bytes: int
    sent_per_layer: int
    allreduces_per_step: int
    compute_s_per_layer: float


def scale_table(
    shapes: Sequence[ModelShape] = (LLAMA_7B, LLAMA_70B),
    tps: Sequence[int] = (1, 2, 4, 8),
    *,
    seq: int = 4096,
    batch: int = 1,
    links: Sequence[str] = ("NVLink H100", "InfiniBand NDR"),
) -> pd.DataFrame:
    """One layer of each shape (a ``ModelShape``; ``model`` is its name) per tp, at one
    sequence length ``seq`` for all, through ``estimate``: its parameters on one rank, model state
    (16 B/param: bf16 mixed precision with Adam), activations (Korthikanti et al., 16-bit,
    dropout masks; with and without sequence parallelism), the bytes of one all-reduce
    (s b h x 2 B), what a rank sends per layer per step (4 ring all-reduces), and the time of
    those 4 all-reduces on each link (``estimate.allreduce_time_on_link`` at the link's
    per-direction bandwidth), and the layer's matmul time per rank (6 x params x tokens FLOPs,
    ``estimate.training_flops_per_token``, over tp ranks at ``UTILIZATION`` of an H100's
    bf16 peak; attention's s^2 FLOPs left out). Bytes in B; seconds."""
    sizes = validate.counts("tps", tps, minimum=1)
    bandwidths = [estimate.link_speed(link).per_direction_GBps for link in links]
    rows, comm_s = [], []
    for shape in shapes:
        s, b, h, a = seq, batch, shape.hidden, shape.heads
        flops = estimate.training_flops_per_token(estimate.tp_layer_state_bytes(shape, 1)["params"])
        for t in sizes:
            check_tp(shape, t)
            state = estimate.tp_layer_state_bytes(shape, t)
            comm = estimate.tp_comm_bytes_per_layer(seq, batch, shape.hidden, t)
            act_tp = estimate.activation_bytes_transformer_layer(s, b, h, a, tp=t)
            act_sp = estimate.activation_bytes_transformer_layer(
                s, b, h, a, tp=t, sequence_parallel=True
            )
            compute_s = flops * (seq * batch) / t / (H100_BF16_FLOPS * UTILIZATION)
            rows.append(
                LayerScaleRow(
                    shape.name,
                    t,
                    state["params"],
                    state["bytes"],
                    act_tp,
                    act_sp,
                    comm["payload"],
                    comm["sent"],
                    4 * shape.layers,
                    compute_s,
                )  # fmt: skip
            )
            comm_s.append(
                [
                    4 * estimate.allreduce_time_on_link(comm["payload"], t, bw) if t > 1 else 0.0
                    for bw in bandwidths
                ]
            )
    df = kit.frame(rows, LayerScaleRow)
    for i, link in enumerate(links):
        df[f"comm_s_per_layer {link}"] = [c[i] for c in comm_s]
    return df


def source_check(n_layer: int = 32) -> dict[str, int | dict[str, int] | dict[str, dict[str, int]]]:
    """S4's counts, recomputed: "one all-gather + one all-reduce per MLP" (Megatron's MLP makes
    one all-reduce in forward, g, and one in backward, f, and no all-gather), and "64
    all-reduces for 32 layers" (2 forward + 2 backward per layer: 4 x 32 = 128)."""
    n = validate.count("n_layer", n_layer, minimum=1)
    per_layer = estimate.tp_collectives_per_layer()
    calls = sum(per_layer["forward"].values()) + sum(per_layer["backward"].values())
    return {
        "quoted_per_mlp": {"all_gather": 1, "all_reduce": 1},
        "megatron_per_mlp": {"forward": {"all_reduce": 1}, "backward": {"all_reduce": 1}},
        "quoted_allreduces": 2 * n,
        "allreduces_per_step": calls * n,
    }


@dataclass(frozen=True)
class SourceBytesRow:
    """One worker of :func:`source_bytes`: its values and their bfloat16 bytes."""

    worker: int
    values: list[float]
    bytes: str  # hex, little-endian, as torch stores them
    nbytes: int


def source_bytes() -> pd.DataFrame:
    """The sources' bfloat16 bytes (S1: 1.0 2.0 3.0 4.0 -> 80 3f 00 40 40 40 80 40), computed:
    each value's little-endian bytes as torch stores them."""
    rows = []
    for worker, values in ((0, [1.0, 2.0, 3.0, 4.0]), (1, [5.0, 6.0, 7.0, 8.0])):
        raw = torch.tensor(values, dtype=torch.bfloat16).view(torch.uint8).tolist()
        rows.append(SourceBytesRow(worker, values, " ".join(f"{v:02x}" for v in raw), len(raw)))
    return kit.frame(rows, SourceBytesRow)
