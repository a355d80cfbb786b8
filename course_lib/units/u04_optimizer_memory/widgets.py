"""Explorer widget of unit 04 (notebooks/04_optimizer_memory.ipynb).

OptimizerExplorer: choose optimizers, a number of steps and a learning-rate multiplier; Run
trains the tiny GPT with each (same seed, same batches) and measures each optimizer's state with
MemoryMeter, then draws the loss curves and the state bytes per parameter. Nothing runs until
Run is pressed.

    ex = OptimizerExplorer(); ex.optimizers.value = ("sgd", "adam"); ex.run_button.click(); ex.result
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING, Any

import ipywidgets as widgets

from course_lib.viz.widgets import Explorer

if TYPE_CHECKING:
    from course_lib.models import GPTConfig


class OptimizerExplorer(Explorer):
    """Optimizer picker + sliders + Run; ``result`` holds the last ``convergence`` DataFrame and
    ``state`` the last ``state_bytes_table``."""

    busy = "training..."
    extras = ("state",)

    def __init__(self, *, config: GPTConfig | None = None) -> None:
        from course_lib.techniques.optim import OPTIMIZERS

        self.config = config
        self.optimizers = widgets.SelectMultiple(
            options=list(OPTIMIZERS),
            value=("sgd", "adam", "adam8bit"),
            description="optimizers",
            rows=7,
        )
        self.steps = widgets.IntSlider(value=20, min=5, max=100, step=5, description="steps")
        self.lr_scale = widgets.FloatLogSlider(
            value=1.0, base=10, min=-1, max=1, step=0.25, description="lr x"
        )
        super().__init__(
            self.optimizers,
            widgets.VBox([self.steps, self.lr_scale]),
            tooltip="train and measure each optimizer",
            intro="Pick optimizers, then press Run.",
        )

    def compute(self) -> Any:
        """Train with each selected optimizer and measure its state."""
        from course_lib.units.u04_optimizer_memory.run import (
            DEFAULT_LR,
            convergence,
            state_bytes_table,
        )

        names = list(self.optimizers.value)
        if not names:
            raise ValueError("optimizers is empty; select at least one")
        lr = {n: DEFAULT_LR[n] * float(self.lr_scale.value) for n in names}
        df = convergence(names, steps=int(self.steps.value), config=self.config, lr=lr)
        self.state = state_bytes_table(names, config=self.config)
        return df

    def summary(self, df: Any) -> str:
        final = df.groupby("optimizer", sort=False)["loss"].last()
        return "final loss: " + ", ".join(f"{html.escape(n)} {v:.3f}" for n, v in final.items())

    def show(self, df: Any) -> list[Any]:
        from course_lib.units.u04_optimizer_memory.plots import plot_convergence, plot_state_bytes

        return [plot_convergence(df), plot_state_bytes(self.state)]
