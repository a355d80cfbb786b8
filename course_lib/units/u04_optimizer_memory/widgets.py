"""Explorer widget of unit 04 (notebooks/04_optimizer_memory.ipynb).

OptimizerExplorer: choose optimizers, a number of steps and a learning-rate multiplier; Run
trains the tiny GPT with each (same seed, same batches) and measures each optimizer's state with
MemoryMeter, then draws the loss curves and the state bytes per parameter. Nothing runs until
Run is pressed.

    ex = OptimizerExplorer(); ex.optimizers.value = ("sgd", "adam"); ex.run_button.click(); ex.result
"""
from __future__ import annotations

import html

import ipywidgets as widgets
import matplotlib.pyplot as plt
import pandas as pd
from IPython.display import display

__all__ = ["OptimizerExplorer"]


class OptimizerExplorer:
    """Optimizer picker + sliders + Run; ``result`` holds the last ``convergence`` DataFrame and
    ``state`` the last ``state_bytes_table``."""

    def __init__(self, *, config=None):
        from course_lib.techniques.optim import OPTIMIZERS

        self.config = config
        self.optimizers = widgets.SelectMultiple(options=list(OPTIMIZERS), value=("sgd", "adam", "adam8bit"),
                                                 description="optimizers", rows=7)
        self.steps = widgets.IntSlider(value=20, min=5, max=100, step=5, description="steps")
        self.lr_scale = widgets.FloatLogSlider(value=1.0, base=10, min=-1, max=1, step=0.25,
                                               description="lr x")
        self.run_button = widgets.Button(description="Run", button_style="primary",
                                         tooltip="train and measure each optimizer")
        self.status = widgets.HTML(value="Pick optimizers, then press Run.")
        self.output = widgets.Output()
        self.result: pd.DataFrame | None = None
        self.state: pd.DataFrame | None = None
        self.run_button.on_click(lambda _button: self.run())
        self.widget = widgets.VBox([
            widgets.HBox([self.optimizers, widgets.VBox([self.steps, self.lr_scale]), self.run_button]),
            self.status, self.output])

    def run(self) -> pd.DataFrame:
        """Train with each selected optimizer and measure its state; plot both."""
        from course_lib.units.u04_optimizer_memory.plots import plot_convergence, plot_state_bytes
        from course_lib.units.u04_optimizer_memory.run import (
            DEFAULT_LR,
            convergence,
            state_bytes_table,
        )

        names = list(self.optimizers.value)
        if not names:
            self.status.value = "Select at least one optimizer."
            raise ValueError("optimizers is empty; select at least one")
        lr = {n: DEFAULT_LR[n] * float(self.lr_scale.value) for n in names}
        self.run_button.disabled = True
        self.status.value = "training..."
        try:
            df = convergence(names, steps=int(self.steps.value), config=self.config, lr=lr)
            state = state_bytes_table(names, config=self.config)
        except Exception as exc:  # noqa: BLE001 - keep the widget usable, show the error
            self.status.value = f"<b>error:</b> {html.escape(type(exc).__name__)}: {html.escape(str(exc))}"
            raise
        finally:
            self.run_button.disabled = False
        self.result, self.state = df, state
        final = df.groupby("optimizer", sort=False)["loss"].last()
        self.status.value = "final loss: " + ", ".join(f"{html.escape(n)} {v:.3f}" for n, v in final.items())
        with self.output:
            self.output.clear_output(wait=True)
            for fig in (plot_convergence(df), plot_state_bytes(state)):
                display(fig)
                plt.close(fig)
        return df
