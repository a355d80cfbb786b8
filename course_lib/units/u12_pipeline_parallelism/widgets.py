"""Unit 12's "Explore" widget (notebooks/12_pipeline_parallelism.ipynb).

ScheduleExplorer: pick a schedule, ranks, micro-batches and (interleaved) stages per rank; Run
launches the ranks, runs one pipeline step and draws its Gantt chart with the idle fraction
measured, replayed and predicted. Nothing runs until Run is pressed.

    ex = ScheduleExplorer(); ex.schedule.value = "gpipe"; ex.run_button.click(); ex.result
"""

from __future__ import annotations

from typing import Any

import ipywidgets as widgets

from course_lib.viz.widgets import Explorer

__all__ = ["ScheduleExplorer"]


class ScheduleExplorer(Explorer):
    """Schedule + ranks + micro-batches + v + Run; ``result`` is (events, bubble table)."""

    busy = "launching the ranks..."
    expected_errors = (ValueError,)

    def __init__(
        self, *, schedule: str = "1f1b", ranks: int = 4, microbatches: int = 8, virtual: int = 2
    ):
        from course_lib.parallel.pipeline import SCHEDULES

        # one control a line, each wide enough for its slider and its whole label (four sliders
        # side by side were squeezed to a few pixels each, their labels cut)
        wide = {"style": {"description_width": "initial"}, "layout": {"width": "360px"}}
        self.schedule = widgets.Dropdown(
            options=SCHEDULES, value=schedule, description="schedule", **wide
        )
        self.ranks = widgets.IntSlider(
            value=ranks, min=2, max=4, description="ranks p", continuous_update=False, **wide
        )
        self.microbatches = widgets.IntSlider(
            value=microbatches,
            min=1,
            max=16,
            description="micro-batches m",
            continuous_update=False,
            **wide,
        )
        self.virtual = widgets.IntSlider(
            value=virtual,
            min=1,
            max=3,
            description="v (interleaved)",
            continuous_update=False,
            **wide,
        )
        super().__init__(
            widgets.VBox([self.schedule, self.ranks, self.microbatches, self.virtual]),
            tooltip="launch the ranks and record one pipeline step",
            intro="Pick a schedule, p, m (and v for interleaved), then press Run.",
        )

    def compute(self) -> Any:
        from course_lib.units.u12_pipeline_parallelism.run import bubble_table, timelines

        p, m, v = int(self.ranks.value), int(self.microbatches.value), int(self.virtual.value)
        events = timelines(
            [self.schedule.value],
            ranks=p,
            microbatches=m,
            virtual=v,
            n_layers=p * v if self.schedule.value == "interleaved" else 2 * p,
            width=64,
            seq=32,
            rows=2 * m,
        )
        return events, bubble_table(events)

    def summary(self, result: Any) -> str:
        b = result[1].iloc[0]
        return (
            f"{b['schedule']}: idle {b['measured']:.0%} measured (this machine), "
            f"{b['replayed']:.0%} replayed on ideal hardware, {b['predicted']:.0%} predicted"
        )

    def show(self, result: Any) -> list[Any]:
        from course_lib.units.u12_pipeline_parallelism.plots import plot_gantt

        return [plot_gantt(*result)]
