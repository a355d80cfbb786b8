"""Explorer widget of unit 05 (notebooks/05_cpu_offload.ipynb).

OffloadExplorer: choose where the optimizer state lives (host RAM or a file), the model width and
the batch; Run trains a few offloaded steps of the tiny GPT, times every part and draws them beside
the step-time model. Nothing runs until Run is pressed.

    ex = OffloadExplorer(); ex.tier.value = "memory"; ex.run_button.click(); ex.result
"""

from __future__ import annotations

from typing import Any

import ipywidgets as widgets

from course_lib.viz.widgets import Explorer


class OffloadExplorer(Explorer):
    """Tier, width and batch + Run; ``result`` holds the last ``step_breakdown`` DataFrame and
    ``predicted`` the step-time model of its median parts."""

    busy = "timing offloaded steps..."
    extras = ("predicted",)

    def __init__(self, *, steps: int = 3):
        self.steps = steps
        self.tier = widgets.ToggleButtons(
            options=["file", "memory"], value="file", description="state in"
        )
        self.width = widgets.SelectionSlider(
            options=[32, 64, 128, 256], value=128, description="n_embd"
        )
        self.batch = widgets.SelectionSlider(
            options=[1, 2, 4, 8, 16, 32], value=8, description="batch"
        )
        super().__init__(
            self.tier,
            widgets.VBox([self.width, self.batch]),
            tooltip="time offloaded steps",
            intro="Pick a tier, a width and a batch, then press Run.",
        )

    def compute(self) -> Any:
        import dataclasses

        from course_lib.units.u05_cpu_offload.run import (
            CONFIG,
            predicted_step_times,
            step_breakdown,
        )

        config = dataclasses.replace(CONFIG, n_embd=int(self.width.value))
        df = step_breakdown(
            tier=self.tier.value, steps=self.steps, config=config, batch=int(self.batch.value)
        )
        self.predicted = predicted_step_times(df.median(numeric_only=True))
        return df

    def summary(self, df: Any) -> str:
        med = df.median(numeric_only=True)
        compute = med["compute"] / med["total"]
        return (
            f"median step {med['total'] * 1e3:.1f} ms, compute {compute:.0%} of it; "
            f"serial estimate {self.predicted['serial_s'] * 1e3:.1f} ms, "
            f"overlapped {self.predicted['overlapped_s'] * 1e3:.1f} ms"
        )

    def show(self, df: Any) -> list[Any]:
        from course_lib.units.u05_cpu_offload.plots import plot_step_breakdown

        return [plot_step_breakdown(df, predicted=self.predicted)]
