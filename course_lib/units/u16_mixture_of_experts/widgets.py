"""Unit 16's "Explore" widget (notebooks/16_mixture_of_experts.ipynb).

RoutingExplorer: pick the ranks, the tokens per rank and how hot expert 0 is; Run launches the
ranks, runs one expert-parallel MoE layer with a trace, and draws each rank's route, dispatch,
experts and combine. Nothing runs until Run is pressed.

    ex = RoutingExplorer(); ex.hot.value = 0.5; ex.run_button.click(); ex.result
"""

from __future__ import annotations

import ipywidgets as widgets

from course_lib.viz.widgets import Explorer

__all__ = ["RoutingExplorer"]

_WIDE = {"description_width": "initial"}  # the whole label, not cut to 90 px


class RoutingExplorer(Explorer):
    """ranks + tokens + hot + Run; ``result`` is ``run.timeline``'s table."""

    busy = "launching the ranks..."
    expected_errors = (ValueError,)

    def __init__(self, *, world_size: int = 2, tokens: int = 1024, hot: float = 0.5):
        self.world_size = widgets.Dropdown(
            options=(2, 4), value=world_size, description="ranks (ep)", style=_WIDE
        )
        self.tokens = widgets.Dropdown(
            options=(512, 1024, 2048), value=tokens, description="tokens per rank", style=_WIDE
        )
        self.hot = widgets.FloatSlider(
            value=hot, min=0.0, max=1.0, step=0.25, style=_WIDE,
            description="skew towards expert 0 (0 = as routed, 1 = nearly all)",
        )  # fmt: skip
        super().__init__(
            self.world_size,
            self.tokens,
            self.hot,
            tooltip="launch the ranks and trace one expert-parallel MoE layer",
            intro=(
                "Pick the ranks, the tokens per rank and how strongly the router is pushed "
                "towards expert 0 (on rank 0), then press Run. Plotted: each rank's route, "
                "dispatch, experts and combine spans of one forward, in milliseconds after a "
                "barrier, routing as it comes (top) and skewed (bottom); the status line: the "
                "token rows the busiest and the idlest rank's experts processed."
            ),
        )

    def compute(self):
        from course_lib.units.u16_mixture_of_experts.run import timeline

        hot = (0.0, float(self.hot.value))
        return timeline(int(self.world_size.value), hot=hot, tokens=int(self.tokens.value))

    def summary(self, result) -> str:
        from course_lib.units.u16_mixture_of_experts.run import imbalance

        b = imbalance(result)
        parts = []
        for hot, part in b.groupby("hot"):
            rows = part.expert_rows
            parts.append(f"hot {hot:g}: busiest rank's experts got {rows.max()} rows, the "
                         f"idlest {rows.min()}")  # fmt: skip
        return "; ".join(parts)

    def show(self, result):
        from course_lib.units.u16_mixture_of_experts.plots import plot_timeline

        return [plot_timeline(result)]
