"""Explorer widget of unit 02 (notebooks/02_batch_size_and_accumulation.ipynb).

AccumulationExplorer: choose a micro-batch, a number of accumulation steps and a memory budget;
Run measures one optimizer step on the effective batch both ways (k accumulated micro-batches, and
one full batch) and says which fits the budget, with the out-of-memory message for the one that
does not. The budget is the slider's number of bytes on every device, labelled as simulated (on a
GPU the real limit, the free device memory, is far larger than these small models need). Nothing
runs until Run is pressed.

    ex = AccumulationExplorer(); ex.steps.value = 8; ex.run_button.click(); ex.result
"""
from __future__ import annotations

import html

import ipywidgets as widgets
import matplotlib.pyplot as plt
import pandas as pd
from IPython.display import display

from course_lib.measure.estimate import MiB, fmt_bytes

__all__ = ["AccumulationExplorer"]


class AccumulationExplorer:
    """Sliders + Run; `result` is the last measurement, `messages` the verdict per mode."""

    def __init__(self, *, device=None, in_features: int = 256, hidden: int = 512):
        self.device = device
        self.in_features = in_features
        self.hidden = hidden
        self.micro_batch = widgets.SelectionSlider(options=[8, 16, 32, 64, 128, 256], value=64,
                                                   description="micro-batch")
        self.steps = widgets.SelectionSlider(options=[1, 2, 4, 8, 16], value=16,
                                             description="accum. steps")
        self.budget_mib = widgets.FloatLogSlider(value=6.0, base=2, min=-6, max=8, step=0.5,
                                                 description="budget MiB")
        self.run_button = widgets.Button(description="Run", button_style="primary",
                                         tooltip="measure one optimizer step both ways")
        self.status = widgets.HTML(value="Set the controls, then press Run.")
        self.output = widgets.Output()
        self.result: pd.DataFrame | None = None
        self.messages: dict[str, str] = {}
        self.run_button.on_click(lambda _button: self.run())
        self.widget = widgets.VBox([
            widgets.HBox([widgets.VBox([self.micro_batch, self.steps, self.budget_mib]),
                          self.run_button]),
            self.status, self.output])

    def run(self, *, render: bool = True) -> pd.DataFrame:
        """Measure the accumulated and the full-batch step; check both against the budget.

        render=False skips drawing into the widget's output area (scripted runs); the
        measurement and the messages are the same.
        """
        import torch

        from course_lib.models import MLP, MLPConfig
        from course_lib.units.u02_batch_size_and_accumulation.run import (
            MemoryBudget,
            SimulatedOOM,
            accumulation_memory_and_time,
            default_device,
        )

        device = torch.device(self.device) if self.device is not None else default_device()
        # the slider's budget is a number we compare against on every device (so: simulated); on a
        # GPU the real limit is the free device memory, reported by MemoryBudget.for_device
        budget = MemoryBudget(int(self.budget_mib.value * MiB), simulated=True)
        self.run_button.disabled = True
        self.status.value = "measuring..."
        try:
            torch.manual_seed(0)
            model = MLP(MLPConfig(in_features=self.in_features, hidden=(self.hidden, self.hidden)))
            df = accumulation_memory_and_time(model, int(self.micro_batch.value),
                                              [int(self.steps.value)], device=device,
                                              warmup=1, repeat=3)
        except Exception as exc:  # noqa: BLE001 - keep the widget usable, show the error
            self.status.value = f"<b>error:</b> {html.escape(type(exc).__name__)}: {html.escape(str(exc))}"
            raise
        finally:
            self.run_button.disabled = False
        self.messages = {}
        for _, row in df.iterrows():
            what = (f"a step on {row['effective_batch']} samples as {row['mode']} "
                    f"(micro-batch {row['micro_batch']})")
            try:
                budget.check(int(row["peak_bytes"]), what=what)
                self.messages[row["mode"]] = (f"{row['mode']}: peak {fmt_bytes(int(row['peak_bytes']))}"
                                              f" fits in {budget.label()}")
            except SimulatedOOM as err:
                self.messages[row["mode"]] = f"{row['mode']}: {err}"
        df = df.assign(fits=[budget.fits(int(p)) for p in df["peak_bytes"]])
        self.result = df
        self.status.value = "<br>".join(html.escape(m) for m in self.messages.values())
        if not render:  # e.g. a scripted run whose caller shows the result itself
            return self.result
        with self.output:
            self.output.clear_output(wait=True)
            from course_lib.viz.plots import style

            with style():
                fig, ax = plt.subplots(figsize=(9, 3.5))
                colors = ["tab:green" if f else "tab:red" for f in df["fits"]]
                ax.barh(df["mode"], df["peak_bytes"] / MiB, color=colors)
                ax.axvline(budget.capacity_bytes / MiB, color="black", ls="--", label=budget.label())
                ax.set_xlabel("measured peak of one optimizer step (MiB)")
                ax.set_title("green: fits the budget, red: out of memory")
                ax.legend(fontsize=11, loc="lower right")
                fig.tight_layout()
            display(fig)
            plt.close(fig)
        return df
