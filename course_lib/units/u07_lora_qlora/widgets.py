"""Explorer widget of unit 07 (notebooks/07_lora_qlora.ipynb).

LoRAExplorer: pick the rank, the layers that get adapters, the methods and the number of steps;
Run fine-tunes the pre-trained tiny GPT on the shifted task with each method (same batches) and
draws the loss curves. Nothing runs until Run is pressed.

    ex = LoRAExplorer(); ex.rank.value = 2; ex.run_button.click(); ex.result
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING, Any

import ipywidgets as widgets

from course_lib.viz.widgets import Explorer

if TYPE_CHECKING:
    from course_lib.models import GPTConfig

__all__ = ["LoRAExplorer"]


class LoRAExplorer(Explorer):
    """Rank, targets, methods, steps + Run; ``result`` holds the last ``run.finetune`` DataFrame."""

    busy = "fine-tuning..."

    def __init__(self, *, config: GPTConfig | None = None) -> None:
        from course_lib.units.u07_lora_qlora.run import GPT_TARGETS, METHODS

        self.config = config
        self.rank = widgets.IntSlider(value=8, min=1, max=64, description="rank r")
        self.targets = widgets.SelectMultiple(
            options=list(GPT_TARGETS), value=tuple(GPT_TARGETS), description="targets", rows=3
        )
        self.methods = widgets.SelectMultiple(
            options=list(METHODS), value=("full", "lora"), description="methods", rows=3
        )
        self.steps = widgets.IntSlider(value=60, min=10, max=200, step=10, description="steps")
        super().__init__(
            widgets.VBox([self.rank, self.steps]),
            self.targets,
            self.methods,
            tooltip="fine-tune with each method",
            intro="Pick a rank and the layers that get adapters, then press Run.",
        )

    def compute(self) -> Any:
        """Fine-tune with each selected method."""
        from course_lib.units.u07_lora_qlora.run import finetune

        if not self.methods.value:
            raise ValueError("methods is empty; select at least one")
        if not self.targets.value:
            raise ValueError("targets is empty; select at least one layer for the adapters")
        return finetune(
            list(self.methods.value),
            r=int(self.rank.value),
            steps=int(self.steps.value),
            targets=list(self.targets.value),
            config=self.config,
        )

    def summary(self, df: Any) -> str:
        final = df.groupby("method", sort=False)["loss"].apply(lambda s: s.tail(10).mean())
        return "final loss: " + ", ".join(f"{html.escape(m)} {v:.3f}" for m, v in final.items())

    def show(self, df: Any) -> list[Any]:
        from course_lib.units.u07_lora_qlora.plots import plot_finetune

        return [plot_finetune(df)]
