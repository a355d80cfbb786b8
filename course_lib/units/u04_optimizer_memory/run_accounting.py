"""Unit 04: 12, 16, 18 or 20 bytes per parameter? One table of the accountings, with their sources.

Used by notebooks/04_optimizer_memory.ipynb through :mod:`run` (which re-exports these names).
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from course_lib import kit
from course_lib.measure import estimate

# --------------------------------------------------------------------------------------------
# 12, 16, 18 or 20 bytes per parameter? One table, with sources
# --------------------------------------------------------------------------------------------
#: (source, what it counts, components as (component, dtype) pairs, where in the source)
ACCOUNTINGS: tuple[tuple[str, str, tuple[tuple[str, str], ...], str], ...] = (
    (
        "ZeRO, K only",
        "optimizer states of mixed-precision Adam (K = 12)",
        (("fp32 master", "fp32"), ("Adam m", "fp32"), ("Adam v", "fp32")),
        "Rajbhandari et al. 2019, arXiv:1910.02054, Sec. 3.1; EleutherAI 'Transformer Math 101' (2023), optimizer states",
    ),
    (
        "fp32 Adam, no grads",
        "fp32 weights + Adam moments, gradients left out",
        (("fp32 weights", "fp32"), ("Adam m", "fp32"), ("Adam v", "fp32")),
        "a common shortcut: 'Adam needs 3x the weights'",
    ),
    (
        "Ultra-Scale Playbook, params+grads",
        "bf16 params and grads plus fp32 copies of both, before optimizer states",
        (
            ("bf16 params", "bf16"),
            ("bf16 grads", "bf16"),
            ("fp32 master", "fp32"),
            ("fp32 grads", "fp32"),
        ),
        "Tazi et al. 2025, The Ultra-Scale Playbook (Hugging Face), 'Memory usage in Transformers'",
    ),
    (
        "12 B, no master copy",
        "bf16 params and grads, fp32 Adam moments, no fp32 master",
        (("bf16 params", "bf16"), ("bf16 grads", "bf16"), ("Adam m", "fp32"), ("Adam v", "fp32")),
        "S2's memory cheat sheet (labelled 'fp16 mixed precision'); an optimizer with fp32 moments on bf16 "
        "weights, e.g. torchdistx AnyPrecisionAdamW with momentum_dtype = variance_dtype = float32",
    ),
    (
        "ZeRO, mixed-precision Adam",
        "2 + 2 + K with K = 12",
        (
            ("fp16 params", "fp16"),
            ("fp16 grads", "fp16"),
            ("fp32 master", "fp32"),
            ("Adam m", "fp32"),
            ("Adam v", "fp32"),
        ),
        "Rajbhandari et al. 2019, arXiv:1910.02054, Sec. 3.1; Micikevicius et al. 2017, arXiv:1710.03740",
    ),
    (
        "fp32 Adam",
        "fp32 weights, fp32 grads, Adam moments",
        (("fp32 weights", "fp32"), ("fp32 grads", "fp32"), ("Adam m", "fp32"), ("Adam v", "fp32")),
        "Kingma & Ba 2014, arXiv:1412.6980 (state), torch.optim.Adam",
    ),
    (
        "HF Transformers docs",
        "mixed precision: fp16 + fp32 weights (6), fp32 grads (4), AdamW (8)",
        (
            ("fp16 weights", "fp16"),
            ("fp32 weights", "fp32"),
            ("fp32 grads", "fp32"),
            ("Adam m", "fp32"),
            ("Adam v", "fp32"),
        ),
        "Hugging Face Transformers docs, 'Model training anatomy' / 'GPU memory usage': 18 bytes/param",
    ),
    (
        "Ultra-Scale Playbook, fp32 grad accumulation",
        "16 plus fp32 gradients kept for accumulation",
        (
            ("bf16 params", "bf16"),
            ("bf16 grads", "bf16"),
            ("fp32 master", "fp32"),
            ("Adam m", "fp32"),
            ("Adam v", "fp32"),
            ("fp32 grads", "fp32"),
        ),
        "Tazi et al. 2025, The Ultra-Scale Playbook: 'some libraries store grads in fp32' (+4N)",
    ),
    (
        "8-bit Adam, mixed precision",
        "bf16 params and grads, fp32 master, 8-bit m and v",
        (
            ("bf16 params", "bf16"),
            ("bf16 grads", "bf16"),
            ("fp32 master", "fp32"),
            ("Adam m", "uint8"),
            ("Adam v", "uint8"),
        ),
        "Dettmers et al. 2021, arXiv:2110.02861; EleutherAI 'Transformer Math 101' (8-bit optimizers: 6 bytes of state)",
    ),
)


@dataclass(frozen=True)
class AccountingRow:
    """One bytes-per-parameter figure of the literature, from its components."""

    source: str
    counts: str
    components: str
    bytes_per_param: int
    reference: str


def accounting_table() -> pd.DataFrame:
    """The bytes-per-parameter figures of the literature, each computed from its components with
    ``estimate.dtype_bytes`` (nothing typed in by hand): source, what it counts, the components,
    bytes per parameter, and the reference."""
    rows = []
    for source, counts, parts, ref in ACCOUNTINGS:
        components = " + ".join(f"{name} {estimate.dtype_bytes(dt)}" for name, dt in parts)
        total = sum(estimate.dtype_bytes(dt) for _, dt in parts)
        rows.append(AccountingRow(source, counts, components, total, ref))
    return kit.frame(rows, AccountingRow)
