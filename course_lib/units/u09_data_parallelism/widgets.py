"""Unit 09's "Explore" widget (notebooks/09_data_parallelism.ipynb).

OverlapExplorer: pick a number of ranks and two bucket caps; Run launches the ranks, trains a
few steps of an 8-layer MLP under the course's DataParallel and shows the last step's timeline
(backward per layer, all-reduce per bucket) for each cap. Nothing runs until Run is pressed.

    ex = OverlapExplorer(); ex.small_cap.value = 0.5; ex.run_button.click(); ex.result
"""

from __future__ import annotations

from typing import Any

import ipywidgets as widgets

from course_lib.viz.widgets import Explorer

__all__ = ["OverlapExplorer"]

_CAPS = (0.25, 0.5, 1.0, 2.0, 4.0, 25.0)


class OverlapExplorer(Explorer):
    """Two bucket caps + ranks + Run; ``result`` is the BucketSweep of the last run."""

    busy = "launching the ranks..."
    expected_errors = (ValueError,)

    def __init__(self, *, world_size: int = 2, small_cap: float = 1.0, large_cap: float = 25.0):
        self.world_size = widgets.IntSlider(
            value=world_size, min=2, max=4, description="ranks", continuous_update=False
        )
        self.small_cap = widgets.Dropdown(options=_CAPS, value=small_cap, description="cap A (MiB)")
        self.large_cap = widgets.Dropdown(options=_CAPS, value=large_cap, description="cap B (MiB)")
        super().__init__(
            self.world_size,
            self.small_cap,
            self.large_cap,
            tooltip="launch the ranks and time a few DataParallel steps",
            intro="Pick ranks and two bucket caps (MiB), then press Run.",
        )

    def compute(self) -> Any:
        from course_lib.units.u09_data_parallelism.run import ddp_bucket_sweep

        caps = sorted({float(self.small_cap.value), float(self.large_cap.value)})
        return ddp_bucket_sweep(
            caps,
            world_size=int(self.world_size.value),
            width=512,
            depth=8,
            batch=64,
            warmup=1,
            steps=2,
            implementations=("course",),
        )

    def summary(self, result: Any) -> str:
        s = result.summary
        parts = [
            f"cap {c:g} MiB: {n} bucket(s), step {t * 1e3:.1f} ms"
            for c, n, t in zip(s.bucket_cap_mb, s.n_buckets, s.step_time_s)
        ]
        return "; ".join(parts) + " (times: this machine, noisy)"

    def show(self, result: Any) -> list[Any]:
        from course_lib.units.u09_data_parallelism.plots import plot_overlap

        return [plot_overlap(result.events)]
