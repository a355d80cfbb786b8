"""Unit 09 at scale: the batch arithmetic of a config, and 7B-70B through estimate.

Used by notebooks/09_data_parallelism.ipynb through :mod:`run` (which re-exports these names).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

from course_lib import kit, validate
from course_lib.measure import estimate


# --------------------------------------------------------------------------------------------
# the batch arithmetic of a config
# --------------------------------------------------------------------------------------------
def accumulation_steps_for(train_batch_size: int, micro_batch_per_gpu: int, world_size: int) -> int:
    """Accumulation steps that make ``train_batch_size = micro x steps x world_size`` hold (the
    equation DeepSpeed asserts at start-up); ValueError when no whole number of steps does."""
    b = validate.count("train_batch_size", train_batch_size, minimum=1)
    m = validate.count("micro_batch_per_gpu", micro_batch_per_gpu, minimum=1)
    n = validate.count("world_size", world_size, minimum=1)
    if b % (m * n):
        raise ValueError(
            f"train_batch_size = {b}: expected a multiple of micro_batch_per_gpu x "
            f"world_size = {m} x {n} = {m * n}"
        )
    return b // (m * n)


# --------------------------------------------------------------------------------------------
# at scale, through estimate
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ScaleRow:
    """One model and link of :func:`scale_table` (bytes; seconds)."""

    params: int
    link: str
    grad_bytes: int
    sent_per_rank: float  # 2(N-1)/N of grad_bytes
    allreduce_s: float
    model_state_per_rank: int
    fits: bool  # the model state fits in the GPU's memory


def scale_table(
    n_params: Sequence[float] = (7e9, 70e9),
    *,
    world_size: int = 8,
    links: Sequence[str] = ("NVLink H100", "InfiniBand NDR"),
    grad_dtype_bytes: int = 2,
    gpu_memory_GB: float = 80.0,
) -> pd.DataFrame:
    """DDP at 7B / 70B: per model and link, the gradient bytes (Psi x ``grad_dtype_bytes``),
    what each rank sends per step (2(N-1)/N of it), the ring all-reduce time at the link's
    per-direction bandwidth (``estimate.allreduce_time_on_link``), and the model state every
    rank must hold (``estimate.model_state_bytes``, bf16-mixed Adam: 16 B/param) against a
    ``gpu_memory_GB`` GPU. Bytes in B, GB = 1e9 B; seconds."""
    n = validate.count("world_size", world_size, minimum=2)
    b = validate.count("grad_dtype_bytes", grad_dtype_bytes, minimum=1)
    mem = validate.number("gpu_memory_GB", gpu_memory_GB, positive=True)
    rows = []
    for psi in n_params:
        psi = validate.count("n_params", psi, minimum=1)
        state = estimate.model_state_bytes(psi, precision="bf16-mixed", optimizer="adam")["total"]
        for name in links:
            link = estimate.link_speed(name)
            grad = psi * b
            rows.append(
                ScaleRow(
                    psi,
                    link.name,
                    grad,
                    estimate.ring_allreduce_bytes_sent(grad, n),
                    estimate.allreduce_time_on_link(grad, n, link.per_direction_GBps),
                    state,
                    state <= mem * 1e9,
                )
            )
    return kit.frame(rows, ScaleRow)


def source_check(
    *,
    size_bytes: float = 14e9,
    world_size: int = 8,
    link_GBps: float = 600.0,
    per_direction_GBps: float = 300.0,
) -> dict[str, float]:
    """S4's "14 GB of gradients at 600 GB/s take about 23 ms", recomputed: the quote divides
    size by bandwidth; a ring all-reduce sends 2(N-1)/N of it from every rank. Seconds."""
    return {
        "quoted_s": size_bytes / (link_GBps * 1e9),
        "ring_s": estimate.allreduce_time_on_link(size_bytes, world_size, link_GBps),
        "ring_per_direction_s": estimate.allreduce_time_on_link(
            size_bytes, world_size, per_direction_GBps
        ),
        "ring_factor": 2 * (world_size - 1) / world_size,
    }
