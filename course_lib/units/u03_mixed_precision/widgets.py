"""Explorer widget of unit 03 (notebooks/03_mixed_precision.ipynb).

PrecisionExplorer: choose the recipes, the batch size and the sequence length; Run measures one
Adam step of the tiny GPT in each recipe with MemoryMeter (``training_memory``) and draws
predicted vs measured memory. Nothing runs until Run is pressed.

    ex = PrecisionExplorer(); ex.modes.value = ("fp32", "bf16-true"); ex.run_button.click(); ex.result
"""
from __future__ import annotations

import html

import ipywidgets as widgets
import matplotlib.pyplot as plt
import pandas as pd
from IPython.display import display

from course_lib.measure.estimate import fmt_bytes

__all__ = ["PrecisionExplorer"]


class PrecisionExplorer:
    """Recipe picker + sliders + Run; ``result`` is the last ``training_memory`` DataFrame."""

    def __init__(self, *, device=None, config=None):
        from course_lib.techniques.precision import MODES

        self.device = device
        self.config = config
        self.modes = widgets.SelectMultiple(options=list(MODES), value=("fp32", "bf16-mixed", "bf16-true"),
                                            description="recipes", rows=4)
        self.batch = widgets.SelectionSlider(options=[1, 2, 4, 8, 16, 32], value=8, description="batch")
        self.seq = widgets.SelectionSlider(options=[8, 16, 32, 64], value=32, description="seq len")
        self.run_button = widgets.Button(description="Run", button_style="primary",
                                         tooltip="measure one training step per recipe")
        self.status = widgets.HTML(value="Pick recipes and sizes, then press Run.")
        self.output = widgets.Output()
        self.result: pd.DataFrame | None = None
        self.run_button.on_click(lambda _button: self.run())
        self.widget = widgets.VBox([
            widgets.HBox([self.modes, widgets.VBox([self.batch, self.seq]), self.run_button]),
            self.status, self.output])

    def run(self) -> pd.DataFrame:
        """Measure one training step per selected recipe; plot predicted vs measured."""
        from course_lib.units.u03_mixed_precision.plots import plot_memory_by_mode
        from course_lib.units.u03_mixed_precision.run import training_memory

        modes = list(self.modes.value)
        if not modes:
            self.status.value = "Select at least one recipe."
            raise ValueError("modes is empty; select at least one of fp32, bf16-mixed, fp16-mixed, bf16-true")
        self.run_button.disabled = True
        self.status.value = "measuring..."
        try:
            df = training_memory(modes, config=self.config, batch=int(self.batch.value),
                                 seq=int(self.seq.value), device=self.device)
        except Exception as exc:  # noqa: BLE001 - keep the widget usable, show the error
            self.status.value = f"<b>error:</b> {html.escape(type(exc).__name__)}: {html.escape(str(exc))}"
            raise
        finally:
            self.run_button.disabled = False
        self.result = df
        peaks = df[df["category"] == "peak"].set_index("mode")["measured"]
        self.status.value = "measured peak: " + ", ".join(
            f"{html.escape(m)} {fmt_bytes(int(v))}" for m, v in peaks.items())
        with self.output:
            self.output.clear_output(wait=True)
            fig = plot_memory_by_mode(df)
            display(fig)
            plt.close(fig)
            display(df.pivot(index="category", columns="mode", values="residual"))
        return df
