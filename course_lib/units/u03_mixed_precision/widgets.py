"""Explorer widget of unit 03 (notebooks/03_mixed_precision.ipynb).

PrecisionExplorer: choose the recipes, the batch size and the sequence length; Run measures one
Adam step of the tiny GPT in each recipe with MemoryMeter (``training_memory``) and draws
predicted vs measured memory. Nothing runs until Run is pressed.

    ex = PrecisionExplorer(); ex.modes.value = ("fp32", "bf16-true"); ex.run_button.click(); ex.result
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING, Any

import ipywidgets as widgets

from course_lib.measure.estimate import fmt_bytes
from course_lib.viz.widgets import Explorer

if TYPE_CHECKING:
    import torch

    from course_lib.models import GPTConfig


class PrecisionExplorer(Explorer):
    """Recipe picker + sliders + Run; ``result`` is the last ``training_memory`` DataFrame."""

    busy = "measuring..."

    def __init__(
        self, *, device: str | torch.device | None = None, config: GPTConfig | None = None
    ) -> None:
        from course_lib.techniques.precision import MODES

        self.device = device
        self.config = config
        self.modes = widgets.SelectMultiple(
            options=list(MODES),
            value=("fp32", "bf16-mixed", "bf16-true"),
            description="recipes",
            rows=4,
        )
        self.batch = widgets.SelectionSlider(
            options=[1, 2, 4, 8, 16, 32], value=8, description="batch"
        )
        self.seq = widgets.SelectionSlider(options=[8, 16, 32, 64], value=32, description="seq len")
        super().__init__(
            self.modes,
            widgets.VBox([self.batch, self.seq]),
            tooltip="measure one training step per recipe",
            intro="Pick recipes and sizes, then press Run.",
        )

    def compute(self) -> Any:
        """Measure one training step per selected recipe."""
        from course_lib.units.u03_mixed_precision.run import training_memory

        modes = list(self.modes.value)
        if not modes:
            raise ValueError(
                "modes is empty; select at least one of fp32, bf16-mixed, fp16-mixed, bf16-true"
            )
        return training_memory(
            modes,
            config=self.config,
            batch=int(self.batch.value),
            seq=int(self.seq.value),
            device=self.device,
        )

    def summary(self, df: Any) -> str:
        peaks = df[df["category"] == "peak"].set_index("mode")["measured"]
        return "measured peak: " + ", ".join(
            f"{html.escape(m)} {fmt_bytes(int(v))}" for m, v in peaks.items()
        )

    def show(self, df: Any) -> list[Any]:
        from course_lib.units.u03_mixed_precision.plots import plot_memory_by_mode

        return [
            plot_memory_by_mode(df),
            df.pivot(index="category", columns="mode", values="residual"),
        ]
