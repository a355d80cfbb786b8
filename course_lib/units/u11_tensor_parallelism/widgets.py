"""Unit 11's "Explore" widget (notebooks/11_tensor_parallelism.ipynb).

SplitExplorer: pick tp, sequence parallelism and the batch; Run launches tp ranks, splits the
tiny GPT, takes one Adam step under MemoryMeter in every rank and shows the per-rank memory
beside the prediction. Nothing runs until Run is pressed.

    ex = SplitExplorer(); ex.tp.value = 4; ex.run_button.click(); ex.result
"""

from __future__ import annotations

from typing import Any

import ipywidgets as widgets

from course_lib.viz.widgets import Explorer

__all__ = ["SplitExplorer"]


class SplitExplorer(Explorer):
    """tp + sequence parallelism + batch + Run; ``result`` is ``run.memory_per_rank``'s table."""

    busy = "launching the ranks..."
    expected_errors = (ValueError,)

    def __init__(self, *, tp: int = 2, sequence_parallel: bool = False, batch: int = 4):
        self.tp = widgets.Dropdown(options=(1, 2, 4), value=tp, description="tp")
        self.sequence_parallel = widgets.Checkbox(
            value=sequence_parallel, description="sequence parallel"
        )
        self.batch = widgets.IntSlider(
            value=batch, min=1, max=16, description="batch", continuous_update=False
        )
        super().__init__(
            self.tp,
            self.sequence_parallel,
            self.batch,
            tooltip="launch tp ranks and measure one Adam step in each",
            intro="Pick tp, sequence parallelism and the batch, then press Run.",
        )

    def compute(self) -> Any:
        from course_lib.units.u11_tensor_parallelism.run import memory_per_rank

        return memory_per_rank(
            (int(self.tp.value),),
            batch=int(self.batch.value),
            sequence_parallel=(bool(self.sequence_parallel.value),),
        )

    def summary(self, result: Any) -> str:
        act = result[(result.category == "activations") & (result["rank"] == 0)]
        parts = [
            f"tp {t}{' + SP' if sp else ''}: activations {m / 1024:,.1f} KiB "
            f"(predicted {p / 1024:,.1f})"
            for t, sp, m, p in zip(act.tp, act.sequence_parallel, act.measured, act.predicted)
        ]
        return "; ".join(parts) + " on rank 0"

    def show(self, result: Any) -> list[Any]:
        from course_lib.units.u11_tensor_parallelism.plots import plot_memory

        return [plot_memory(result)]
