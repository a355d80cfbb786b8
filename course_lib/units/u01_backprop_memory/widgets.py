"""Explorer widget of unit 01 (notebooks/01_backprop_memory.ipynb).

StepMemoryExplorer: pick a model (MLP or tiny GPT), its width, the batch and the optimizer, press
Run: one real training step runs under MemoryMeter and the widget shows the prediction beside the
measurement, per category, and the step's memory timeline. Sliders do nothing until Run is pressed.

Driven from Python (tests do this):
    ex = StepMemoryExplorer(); ex.batch.value = 64; ex.run_button.click(); ex.result
"""

from __future__ import annotations

import ipywidgets as widgets

from course_lib.measure.estimate import fmt_bytes
from course_lib.viz.widgets import Explorer


class StepMemoryExplorer(Explorer):
    """Sliders + Run. After a run: ``result`` (the comparison table, a DataFrame), ``timeline``
    (the step's memory timeline) and ``meter`` (the MemoryMeter of the step)."""

    busy = "running one training step..."
    extras = ("timeline", "meter")

    def __init__(self, *, device="cpu", seq: int = 32):
        self.device = device
        self.seq = seq
        self.model_kind = widgets.Dropdown(
            options=[("MLP (2 hidden layers)", "mlp"), ("tiny GPT", "gpt")],
            value="mlp",
            description="model",
        )
        self.width = widgets.SelectionSlider(
            options=[32, 64, 128, 256, 512], value=128, description="width"
        )
        self.batch = widgets.SelectionSlider(
            options=[1, 2, 4, 8, 16, 32, 64, 128, 256], value=32, description="batch"
        )
        self.optimizer = widgets.Dropdown(
            options=["sgd", "momentum", "adam"], value="adam", description="optimizer"
        )
        super().__init__(
            widgets.VBox([self.model_kind, self.optimizer]),
            widgets.VBox([self.width, self.batch]),
            tooltip="run one training step under MemoryMeter",
        )

    def _shape(self) -> tuple[int, ...]:
        batch = int(self.batch.value)
        return (batch,) if self.model_kind.value == "mlp" else (batch, self.seq)

    def _build(self):
        import torch

        from course_lib.models import GPT, MLP, GPTConfig, MLPConfig

        torch.manual_seed(0)
        w = int(self.width.value)
        if self.model_kind.value == "mlp":
            return MLP(MLPConfig(in_features=w, hidden=(w, w)))
        return GPT(GPTConfig.tiny(n_embd=w, n_head=4, block_size=self.seq))

    def compute(self):
        from course_lib.units.u01_backprop_memory.run import compare_step_memory, step_timeline

        model, shape, opt = self._build(), self._shape(), self.optimizer.value
        table = compare_step_memory(model, shape, opt, device=self.device)
        self.timeline, self.meter = step_timeline(model, shape, optimizer=opt, device=self.device)
        return table

    def summary(self, table) -> str:
        return (
            f"{self.model_kind.value}, width {self.width.value}, batch shape {self._shape()}, "
            f"{self.optimizer.value}: measured peak <b>{fmt_bytes(self.meter.peak_bytes)}</b> "
            f"during {self.meter.peak_phase}"
        )

    def show(self, table):
        from course_lib.viz.plots import plot_memory_timeline

        shown = table.assign(
            **{c: table[c].map(fmt_bytes) for c in ("predicted", "measured", "residual")}
        )
        return [
            shown,
            plot_memory_timeline(self.timeline, title="memory during the step, by category"),
        ]
