"""Unit 09's bucket sweep: ``measure.bucket_sweep`` run with the course's own DataParallel
beside torch's DDP, and its summary per implementation and cap."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pandas as pd

from course_lib.measure import bucket_sweep
from course_lib.measure.bucket_sweep import BucketSweep, Implementation

__all__ = ["BucketSweep", "ddp_bucket_sweep", "summarize_sweep"]


def ddp_bucket_sweep(
    bucket_caps_mb: Sequence[float] = (1, 2, 4, 25),
    *,
    implementations: Sequence[Implementation] | Implementation = ("torch",),
    **options: Any,
) -> BucketSweep:
    """:func:`course_lib.measure.bucket_sweep.ddp_bucket_sweep` with "course" meaning the
    course's ``parallel.ddp.DataParallel``; ``options`` as there (world_size, width, depth,
    batch, warmup, steps, backend, timeout)."""
    from course_lib.parallel.ddp import DataParallel

    return bucket_sweep.ddp_bucket_sweep(
        bucket_caps_mb, implementations=implementations, ours=DataParallel, **options
    )


def summarize_sweep(sweep: BucketSweep) -> pd.DataFrame:
    """Per implementation and cap: n_buckets, step and no-DDP times (ms), and the ratio of our
    step time to torch's at the same cap (printed, never graded)."""
    s = sweep.summary.assign(
        step_ms=sweep.summary.step_time_s * 1e3, no_ddp_ms=sweep.summary.local_step_time_s * 1e3
    )
    torch_ms = s[s.implementation == "torch"].set_index("bucket_cap_mb").step_ms
    s["vs_torch"] = [
        ms / torch_ms.get(cap, math.nan) for cap, ms in zip(s.bucket_cap_mb, s.step_ms)
    ]
    return s[["implementation", "bucket_cap_mb", "n_buckets", "step_ms", "no_ddp_ms", "vs_torch"]]
