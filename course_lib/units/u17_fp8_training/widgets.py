"""Explorer widget of unit 17 (notebooks/17_fp8_training.ipynb).

OutlierExplorer: pick the outlier's size, the channel and the tile width; Run casts the captured
activations of the unit's GPT with every scaling and draws the errors. Nothing runs until Run is
pressed.

    ex = OutlierExplorer(); ex.block.value = 16; ex.run_button.click(); ex.result
"""

from __future__ import annotations

import html

import ipywidgets as widgets

from course_lib.viz.widgets import Explorer

__all__ = ["OutlierExplorer"]


class OutlierExplorer(Explorer):
    """Largest outlier factor, channel, tile width + Run; ``result`` holds ``run.outlier_table``."""

    busy = "casting..."

    def __init__(self):
        self.largest = widgets.IntSlider(value=4, min=1, max=6, description="up to 10^")
        self.channel = widgets.IntSlider(value=3, min=0, max=127, description="channel")
        self.block = widgets.Dropdown(
            options=[8, 16, 32, 64, 128], value=32, description="tile 1 x"
        )
        super().__init__(
            widgets.VBox([self.largest, self.channel]),
            self.block,
            tooltip="cast with every scaling",
            intro="Grow one channel of real activations and watch what each scaling does to the rest.",
        )

    def compute(self):
        """Cast at factors 1, 10, ..., 10^largest."""
        from course_lib.units.u17_fp8_training.run import outlier_table

        factors = [10**i for i in range(int(self.largest.value) + 1)]
        return outlier_table(factors, channel=int(self.channel.value), block=int(self.block.value))

    def summary(self, df) -> str:
        last = df[df["outlier x"] == df["outlier x"].max()]
        parts = [
            f"{html.escape(r.cast)} {r['error, other channels']:.2%}" for _, r in last.iterrows()
        ]
        return "error of the other channels at the largest outlier: " + ", ".join(parts)

    def show(self, df):
        from course_lib.units.u17_fp8_training.plots import plot_outliers

        return [plot_outliers(df)]
