"""Unit 15's "Explore" widget (notebooks/15_context_parallelism.ipynb).

RingExplorer: pick the ranks, the sequence length and whether attention is causal; Run launches
the ranks, runs ring attention forward and backward in both layouts with a trace, and draws the
timeline with the blocks each rank computed. Nothing runs until Run is pressed.

    ex = RingExplorer(); ex.world_size.value = 2; ex.run_button.click(); ex.result
"""

from __future__ import annotations

import ipywidgets as widgets

from course_lib.viz.widgets import Explorer

__all__ = ["RingExplorer"]

_WIDE = {"description_width": "initial"}  # the whole label, not cut to 90 px


class RingExplorer(Explorer):
    """ranks + sequence + Run; ``result`` is ``run.timeline``'s table."""

    busy = "launching the ranks..."
    expected_errors = (ValueError,)

    def __init__(self, *, world_size: int = 2, seq: int = 768):
        self.world_size = widgets.Dropdown(
            options=(2, 3, 4), value=world_size, description="ranks (cp)", style=_WIDE
        )
        self.seq = widgets.Dropdown(
            options=(384, 768, 1536),
            value=seq,
            description="sequence (tokens, all ranks)",
            style=_WIDE,
        )
        super().__init__(
            self.world_size,
            self.seq,
            tooltip="launch the ranks and trace ring attention in both layouts",
            intro=(
                "Pick the ranks and the length of the whole sequence, then press Run (causal "
                "attention). Plotted: each rank's compute (blue) and wait (orange) spans, in "
                "milliseconds after a barrier, forward then backward; the status line: the "
                "least-loaded rank's compute time as a share of the busiest rank's."
            ),
        )

    def compute(self):
        from course_lib.units.u15_context_parallelism.run import timeline

        return timeline(int(self.world_size.value), shape=(1, 4, 4, int(self.seq.value), 16))

    def summary(self, result) -> str:
        from course_lib.units.u15_context_parallelism.run import balance

        b = balance(result)
        parts = [
            f"{lay}: least-loaded rank computes {part.compute_vs_busiest.min():.0%} of the busiest"
            for lay, part in b.groupby("layout")
        ]
        return "; ".join(parts)

    def show(self, result):
        from course_lib.units.u15_context_parallelism.plots import plot_timeline

        return [plot_timeline(result)]
