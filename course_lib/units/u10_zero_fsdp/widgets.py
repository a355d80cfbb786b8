"""Unit 10's "Explore" widget (notebooks/10_zero_fsdp.ipynb).

StageExplorer: pick a number of ranks and a hidden width; Run launches the ranks, takes one
AdamW step under each ZeRO stage and shows the model state every rank holds, measured by
MemoryMeter beside the prediction. Nothing runs until Run is pressed.

    ex = StageExplorer(); ex.world_size.value = 3; ex.run_button.click(); ex.result
"""

from __future__ import annotations

from typing import Any

import ipywidgets as widgets

from course_lib.viz.widgets import Explorer

__all__ = ["StageExplorer"]


class StageExplorer(Explorer):
    """Ranks + Run; ``result`` is the ``memory_table`` DataFrame of the last run."""

    busy = "launching the ranks..."
    expected_errors = (ValueError,)

    def __init__(self, *, world_size: int = 3):
        self.world_size = widgets.IntSlider(
            value=world_size, min=1, max=4, description="ranks", continuous_update=False
        )
        super().__init__(
            self.world_size,
            tooltip="launch the ranks and measure one step under stages 0-3",
            intro="Pick the number of ranks, then press Run.",
        )

    def compute(self) -> Any:
        from course_lib.units.u10_zero_fsdp.run import memory_table

        return memory_table((int(self.world_size.value),))

    def summary(self, result: Any) -> str:
        r0 = result[result["rank"] == 0]
        parts = [f"stage {s}: {t / 1024:.0f} KiB" for s, t in zip(r0.stage, r0.total)]
        exact = bool((result.residual == 0).all())
        return "; ".join(parts) + f" per rank (measured = predicted on every rank: {exact})"

    def show(self, result: Any) -> list[Any]:
        from course_lib.units.u10_zero_fsdp.plots import plot_memory

        return [plot_memory(result)]
