"""Unit 12, weight versions without flushes: PipeDream-2BW beside GPipe/1F1B and the original
PipeDream, executed exactly in one process (``parallel.pipeline.two_bw.run_versions``).

A tiny regression (a 4-layer tanh MLP cut into 4 stages, a fixed linear teacher, float64) trained
with SGD under each policy: the bytes of weight versions each stage held (measured from the
tensors kept), which version every micro-batch used, and the loss per step. Used by
notebooks/12_pipeline_parallelism.ipynb through :mod:`run`.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch
from torch import nn

from course_lib import kit, validate

#: policy label -> ``run_versions``'s policy
VERSION_POLICIES = {
    "GPipe / 1F1B (flush)": "flush",
    "PipeDream-2BW": "2bw",
    "PipeDream (per micro-batch)": "pipedream",
}


@dataclass(frozen=True)
class VersionRow:
    """:func:`weight_versions`: the weight versions one stage kept alive under one policy."""

    policy: str
    stage: int
    versions: int
    bytes: int
    one_version_bytes: int
    lag: int
    steps_behind: list[int] | None  # per-step policies only


def versions_model(seed: int = 0) -> nn.Sequential:
    """8 modules, 2 per stage: Linear(8, 32) Tanh, Linear(32, 32) Tanh, Linear(32, 32) Tanh,
    Linear(32, 1) Identity, float64."""
    torch.manual_seed(seed)
    sizes = [(8, 32), (32, 32), (32, 32), (32, 1)]
    mods: list[nn.Module] = []
    for k, (i, o) in enumerate(sizes):
        mods += [nn.Linear(i, o), nn.Tanh() if k < 3 else nn.Identity()]
    return nn.Sequential(*mods).double()


def versions_batches(steps: int, rows: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``steps`` batches of ``rows`` rows of one linear teacher (course_lib.data), float64."""
    from course_lib.data import regression_task

    x, y = regression_task(steps * rows, 8, 1, seed=0)
    return [(x[k : k + rows].double(), y[k : k + rows].double()) for k in range(0, len(x), rows)]


def weight_versions(
    *, stages: int = 4, microbatches: int = 4, steps: int = 40, rows: int = 16, lr: float = 0.05
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Run every policy of :data:`VERSION_POLICIES` for ``steps`` SGD steps (one intra-op
    thread). Returns ``(memory, losses)``: memory has one row per policy and stage (versions and
    bytes: the most alive after any action, MEASURED; one_version_bytes: the stage's parameters;
    lag: forward version minus backward version, largest over micro-batches; steps_behind: the
    values of step t minus the version its micro-batches used, per-step policies only); losses
    one column per policy, one row per step."""
    from course_lib.parallel.pipeline import split_layers
    from course_lib.parallel.pipeline.two_bw import run_versions

    p = validate.count("stages", stages, minimum=1)
    m = validate.count("microbatches", microbatches, minimum=1)
    steps = validate.count("steps", steps, minimum=1)
    split = split_layers(8, p)
    batches = versions_batches(steps, rows)
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        runs = {
            label: run_versions(
                versions_model(), split, batches, microbatches=m, policy=policy, lr=lr
            )
            for label, policy in VERSION_POLICIES.items()
        }
    finally:
        torch.set_num_threads(saved)
    model = versions_model()
    rows_out = []
    for (label, run), policy in zip(runs.items(), VERSION_POLICIES.values()):
        for s, r in enumerate(split):
            one = sum(p.numel() * p.element_size() for i in r for p in model[i].parameters())
            used = {j: v for (st, j), v in run.used.items() if st == s}
            rows_out.append(
                VersionRow(label, s, run.peak_versions[s], run.peak_bytes[s], one,
                           max(abs(f - b) for f, b in used.values()),
                           None if policy == "pipedream" else
                           sorted({j // m - f for j, (f, _) in used.items()}))
            )  # fmt: skip
    losses = pd.DataFrame({label: run.losses for label, run in runs.items()})
    losses.index.name = "step"
    return kit.frame(rows_out, VersionRow), losses
