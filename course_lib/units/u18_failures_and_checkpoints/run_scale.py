"""Unit 18 at scale: Llama 3 405B's interruptions (Llama Team 2024, arXiv:2407.21783, Sec. 3.3.4,
Table 5) scaled by cluster size, Young's and Daly's intervals, and goodput against the interval.

Used by notebooks/18_failures_and_checkpoints.ipynb through :mod:`run` (which re-exports these).
Nothing here is measured: formulas and the paper's numbers, with this machine's measured restart
time only where a caller passes it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from course_lib import kit, validate
from course_lib.measure import estimate

#: Llama Team 2024 (arXiv:2407.21783), Sec. 3.3.4: a 54-day snapshot of 405B pre-training on up
#: to 16,384 H100 GPUs: 466 job interruptions, 47 planned, 419 unexpected, about 78 % of those
#: confirmed or suspected hardware; "higher than 90 % effective training time"
LLAMA3: dict[str, Any] = {
    "gpus": 16384,
    "days": 54,
    "interruptions": 466,
    "planned": 47,
    "unexpected": 419,
    "hardware share": 0.78,
    "effective training time": 0.90,
    "source": "Llama Team 2024, arXiv:2407.21783, Sec. 3.3.4 (Table 5)",
}

#: parameters of Llama 3 405B (the paper's name; its exact count in unit 14's table)
PARAMS_405B = 405_000_000_000


def gpu_mtbf_s() -> float:
    """Mean time between unexpected interruptions of one GPU's share of the job (seconds):
    the job's MTBF times the GPUs (failures of independent parts add up)."""
    job = estimate.job_mtbf(LLAMA3["days"] * 86400, LLAMA3["unexpected"])
    return float(job * LLAMA3["gpus"])


@dataclass(frozen=True)
class ScaleRow:
    """:func:`scale_table`: one cluster size, Young's and Daly's intervals and their goodput."""

    GPUs: int
    mtbf_h: float = field(metadata=kit.column("job MTBF h"))
    save_s: float = field(metadata=kit.column("save s"))
    young_min: float = field(metadata=kit.column("Young interval min"))
    daly_min: float = field(metadata=kit.column("Daly interval min"))
    goodput_young: float = field(metadata=kit.column("goodput (Young)"))
    goodput_daly: float = field(metadata=kit.column("goodput (Daly)"))


def scale_table(
    gpus: Sequence[int] = (1024, 4096, 16384, 65536, 131072),
    *,
    write_GBps: float = 2000.0,
    restart_s: float = 600.0,
) -> pd.DataFrame:
    """Per cluster size: job MTBF (Llama 3's per-GPU rate), the save time of a 405B checkpoint
    (14 B/param) at ``write_GBps``, Young's and Daly's intervals and the goodput at each, with
    ``restart_s`` per failure."""
    ns = validate.counts("gpus", gpus)
    bw = validate.number("write_GBps", write_GBps, positive=True) * 1e9
    save = estimate.checkpoint_size_bytes(PARAMS_405B) / bw
    rows = []
    for n in ns:
        m = gpu_mtbf_s() / n
        young = estimate.optimal_interval(save, m)
        daly = estimate.optimal_interval(save, m, method="daly")
        goodputs = [estimate.goodput(t, save, m, restart_s=restart_s) for t in (young, daly)]
        rows.append(ScaleRow(n, m / 3600, save, young / 60, daly / 60, *goodputs))
    return kit.frame(rows, ScaleRow)


@dataclass(frozen=True)
class GoodputRow:
    """:func:`goodput_curve`: the goodput at one checkpoint interval."""

    interval_s: float
    goodput: float


def goodput_curve(
    save_s: float, mtbf_s: float, *, restart_s: float = 0.0, points: int = 60
) -> pd.DataFrame:
    """Goodput against the checkpoint interval (log-spaced around Young's): interval_s, goodput."""
    young = estimate.optimal_interval(save_s, mtbf_s)
    n = validate.count("points", points, minimum=2)
    taus = np.geomspace(young / 30, min(young * 30, 20 * mtbf_s), n).tolist()
    rows = [GoodputRow(t, estimate.goodput(t, save_s, mtbf_s, restart_s=restart_s)) for t in taus]
    return kit.frame(rows, GoodputRow)
