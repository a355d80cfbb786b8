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
from typing import TYPE_CHECKING, Any

import ipywidgets as widgets

from course_lib.measure.estimate import MiB, fmt_bytes
from course_lib.viz.widgets import Explorer

if TYPE_CHECKING:
    import torch


class AccumulationExplorer(Explorer):
    """Sliders + Run. After a run: ``result`` (the measurement, one row per mode, with ``fits``),
    ``messages`` (the verdict per mode) and ``budget`` (the MemoryBudget it was checked against)."""

    busy = "measuring..."
    extras = ("messages", "budget")

    def __init__(
        self, *, device: str | torch.device | None = None, in_features: int = 256, hidden: int = 512
    ) -> None:
        self.device = device
        self.in_features = in_features
        self.hidden = hidden
        self.micro_batch = widgets.SelectionSlider(
            options=[8, 16, 32, 64, 128, 256], value=64, description="micro-batch"
        )
        self.steps = widgets.SelectionSlider(
            options=[1, 2, 4, 8, 16], value=16, description="accum. steps"
        )
        # 1, 1.5, 2, 3, 4, 6, ... MiB: a log scale whose every stop is a number the result
        # prints as it is (a float log slider with step 0.5 showed 6.0 as 5.66)
        budgets = sorted(f * 2.0**k for k in range(-6, 9) for f in (1.0, 1.5) if f * 2.0**k <= 256)
        self.budget_mib = widgets.SelectionSlider(
            options=[(f"{b:g}", b) for b in budgets], value=6.0, description="budget MiB"
        )
        super().__init__(
            widgets.VBox([self.micro_batch, self.steps, self.budget_mib]),
            tooltip="measure one optimizer step both ways",
        )

    def compute(self) -> Any:
        """Measure the accumulated and the full-batch step; check both against the budget."""
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
        self.budget = budget = MemoryBudget(int(self.budget_mib.value * MiB), simulated=True)
        torch.manual_seed(0)
        model = MLP(MLPConfig(in_features=self.in_features, hidden=(self.hidden, self.hidden)))
        df = accumulation_memory_and_time(
            model,
            int(self.micro_batch.value),
            [int(self.steps.value)],
            device=device,
            warmup=1,
            repeat=3,
        )
        self.messages = {}
        for _, row in df.iterrows():
            what = (
                f"a step on {row['effective_batch']} samples as {row['mode']} "
                f"(micro-batch {row['micro_batch']})"
            )
            try:
                budget.check(int(row["peak_bytes"]), what=what)
                self.messages[row["mode"]] = (
                    f"{row['mode']}: peak {fmt_bytes(int(row['peak_bytes']))}"
                    f" fits in {budget.label()}"
                )
            except SimulatedOOM as err:
                self.messages[row["mode"]] = f"{row['mode']}: {err}"
        return df.assign(fits=[budget.fits(int(p)) for p in df["peak_bytes"]])

    def summary(self, df: Any) -> str:
        return "<br>".join(html.escape(m) for m in self.messages.values())

    def show(self, df: Any) -> list[Any]:
        from course_lib.units.u02_batch_size_and_accumulation.plots import plot_budget_check

        return [plot_budget_check(df, self.budget.capacity_bytes, label=self.budget.label())]
