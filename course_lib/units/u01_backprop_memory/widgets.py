"""Explorer widget of unit 01 (notebooks/01_backprop_memory.ipynb).

StepMemoryExplorer: pick a model (MLP or tiny GPT), its width, the batch and the optimizer, press
Run: one real training step runs under MemoryMeter and the widget shows the prediction beside the
measurement, per category, and the step's memory timeline. Sliders do nothing until Run is pressed.

Driven from Python (tests do this):
    ex = StepMemoryExplorer(); ex.batch.value = 64; ex.run_button.click(); ex.result
"""
from __future__ import annotations

import html

import ipywidgets as widgets
import matplotlib.pyplot as plt
import pandas as pd
from IPython.display import display

from course_lib.measure.estimate import fmt_bytes

__all__ = ["StepMemoryExplorer"]


class StepMemoryExplorer:
    """Sliders + Run button; `result` holds the last comparison table (pandas DataFrame)."""

    def __init__(self, *, device="cpu", seq: int = 32):
        self.device = device
        self.seq = seq
        self.model_kind = widgets.Dropdown(options=[("MLP (2 hidden layers)", "mlp"),
                                                    ("tiny GPT", "gpt")],
                                           value="mlp", description="model")
        self.width = widgets.SelectionSlider(options=[32, 64, 128, 256, 512], value=128,
                                             description="width")
        self.batch = widgets.SelectionSlider(options=[1, 2, 4, 8, 16, 32, 64, 128, 256], value=32,
                                             description="batch")
        self.optimizer = widgets.Dropdown(options=["sgd", "momentum", "adam"], value="adam",
                                          description="optimizer")
        self.run_button = widgets.Button(description="Run", button_style="primary",
                                         tooltip="run one training step under MemoryMeter")
        self.status = widgets.HTML(value="Set the controls, then press Run.")
        self.output = widgets.Output()
        self.result: pd.DataFrame | None = None
        self.timeline: pd.DataFrame | None = None
        self.run_button.on_click(lambda _button: self.run())
        controls = widgets.HBox([widgets.VBox([self.model_kind, self.optimizer]),
                                 widgets.VBox([self.width, self.batch]), self.run_button])
        self.widget = widgets.VBox([controls, self.status, self.output])

    def _build(self):
        import torch

        from course_lib.models import GPT, MLP, GPTConfig, MLPConfig

        torch.manual_seed(0)
        w = int(self.width.value)
        if self.model_kind.value == "mlp":
            return MLP(MLPConfig(in_features=w, hidden=(w, w))), (int(self.batch.value),)
        cfg = GPTConfig.tiny(n_embd=w, n_head=4, block_size=self.seq)
        return GPT(cfg), (int(self.batch.value), self.seq)

    def run(self, *, render: bool = True) -> pd.DataFrame:
        """Measure one step with the current settings; update status, table and plot.

        render=False skips drawing into the widget's output area (for scripted runs, e.g. a
        notebook cell that shows `result` itself); the measurement is the same.
        """
        from course_lib.units.u01_backprop_memory.run import compare_step_memory, step_timeline

        self.run_button.disabled = True
        self.status.value = "running one training step..."
        try:
            model, shape = self._build()
            table = compare_step_memory(model, shape, self.optimizer.value, device=self.device)
            timeline, meter = step_timeline(model, shape, optimizer=self.optimizer.value,
                                            device=self.device)
        except Exception as exc:  # noqa: BLE001 - keep the widget usable, show the error
            self.status.value = f"<b>error:</b> {html.escape(type(exc).__name__)}: {html.escape(str(exc))}"
            raise
        finally:
            self.run_button.disabled = False
        self.result, self.timeline = table, timeline
        self.status.value = (
            f"{self.model_kind.value}, width {self.width.value}, batch shape {shape}, "
            f"{self.optimizer.value}: measured peak <b>{fmt_bytes(meter.peak_bytes)}</b> "
            f"during {meter.peak_phase}")
        shown = table.assign(**{c: table[c].map(fmt_bytes)
                                for c in ("predicted", "measured", "residual")})
        if not render:  # e.g. a scripted run whose caller shows the result itself
            return self.result
        with self.output:
            self.output.clear_output(wait=True)
            display(shown)
            fig = _timeline_figure(timeline)
            display(fig)
            plt.close(fig)
        return table


def _timeline_figure(timeline: pd.DataFrame):
    from course_lib.viz.plots import plot_memory_timeline

    return plot_memory_timeline(timeline, title="memory during the step, by category")
