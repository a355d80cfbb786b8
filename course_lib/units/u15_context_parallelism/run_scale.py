"""Unit 15 at scale (notebooks/15_context_parallelism.ipynb, "Scale it up"): Llama 3 405B's 8K
and 128K phases through ``measure.estimate``. Nothing runs on ranks. Re-exported by ``run.py``.

Shapes and layouts: Llama Team 2024, "The Llama 3 Herd of Models", arXiv:2407.21783, Table 3
(126 layers, width 16,384, FFN 53,248, 128 heads, 8 key/value heads) and Table 4 (the
parallelism of each phase).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from course_lib import kit, validate
from course_lib.measure import estimate

__all__ = ["LLAMA3_405B", "LLAMA3_TABLE4", "ScaleRow", "llama3_scale"]

#: Llama 3 405B (arXiv:2407.21783, Table 3)
LLAMA3_405B = {"layers": 126, "hidden": 16384, "ffn": 53248, "heads": 128, "kv_heads": 8}

#: arXiv:2407.21783, Table 4: the three layouts of Llama 3 405B's pre-training, as published
LLAMA3_TABLE4 = pd.DataFrame(
    [
        (8192, 8, 1, 16, 64, 8192, 32, 430, 43),
        (16384, 8, 1, 16, 128, 8192, 16, 400, 41),
        (16384, 8, 16, 16, 8, 131072, 16, 380, 38),
    ],
    columns=["gpus", "tp", "cp", "pp", "dp", "seq", "batch_per_dp", "tflops_per_gpu", "mfu_pct"],
)


@dataclass(frozen=True)
class ScaleRow:
    """:func:`llama3_scale`: one layer at one (seq, cp): activations and bytes sent per rank."""

    seq: int
    cp: int
    tokens_per_rank: int
    act_flash_GiB: float
    act_flash_allgather_GiB: float
    act_no_flash_GiB: float
    ring_MiB: float | None
    allgather_MiB: float | None
    ulysses_MiB: float | None


def _sent_MiB(
    seq: int, batch: int, cp: int, method: estimate.CpMethod, **common: Any
) -> float | None:
    """MiB one rank sends per layer (forward + backward); None where ``method`` cannot split."""
    m = LLAMA3_405B
    try:
        sent = estimate.cp_comm_bytes_per_layer(
            seq, batch, m["hidden"], m["heads"], cp, method=method, **common
        )["sent"]
    except ValueError:
        return None
    return float(sent) / 2**20


def llama3_scale(
    seqs: Sequence[int] = (8192, 131072),
    cps: Sequence[int] = (1, 16),
    *,
    tp: int = 8,
    batch: int = 1,
) -> pd.DataFrame:
    """One Llama 3 405B layer on one GPU, bf16, ``batch`` sequences per micro-batch, tensor
    parallel ``tp`` with sequence parallelism, the sequence split over ``cp`` ranks. One row
    per (seq, cp): tokens per rank; activation GiB per layer with FlashAttention (ring /
    Ulysses keep no score matrix; all-gather also keeps the gathered K/V) and without it (the
    softmax of the local queries over all keys, Korthikanti et al.'s 5as^2b/t term divided by
    cp once); MiB each rank sends per layer (forward + backward) for each method (None where
    Ulysses cannot split the heads per tensor-parallel rank over cp)."""
    m = LLAMA3_405B
    rows = []
    common = dict(kv_heads=m["kv_heads"], tp=tp)
    for s in validate.counts("seqs", seqs, minimum=1):
        for c in validate.counts("cps", cps, minimum=1):
            act: dict[str, Any] = dict(
                cp=c, ffn=m["ffn"], gated_mlp=True, sequence_parallel=True, **common
            )
            variants: tuple[dict[str, Any], ...] = (
                dict(method="ring"), dict(method="allgather"), dict(flash=False)
            )  # fmt: skip
            gib = [
                estimate.cp_activation_bytes_per_layer(
                    s, batch, m["hidden"], m["heads"], **act, **kw
                )
                / 2**30
                for kw in variants
            ]
            sent = [_sent_MiB(s, batch, c, method, **common) for method in estimate.CP_METHODS]
            rows.append(ScaleRow(s, c, s // c, *gib, *sent))
    return kit.frame(rows, ScaleRow)
