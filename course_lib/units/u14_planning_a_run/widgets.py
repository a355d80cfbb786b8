"""Unit 14's "Explore" widget (notebooks/14_planning_a_run.ipynb).

PlanExplorer: a model preset (or "custom", shaped by the layers and hidden sliders, which only
"custom" shows), a sequence length (for every model), a cluster preset, a GPU count and a
global batch; Run plans the run and shows the ranked plans, why the winner wins, and
the memory of the top three. Nothing runs until Run is pressed.

    ex = PlanExplorer(); ex.model.value = "Llama-2-70B"; ex.gpus.value = 64; ex.run_button.click()
"""

from __future__ import annotations

import ipywidgets as widgets

from course_lib.viz.widgets import Explorer

__all__ = ["PlanExplorer", "CUSTOM"]

CUSTOM = "custom (sliders)"
SEQ_LENGTHS = [2048, 4096, 8192]  # the seq choices; a preset's own length is added when it differs


class PlanExplorer(Explorer):
    """Model + cluster + GPUs + batch + Run; ``result`` is the plan DataFrame."""

    busy = "planning..."
    expected_errors = (ValueError,)

    def __init__(
        self,
        *,
        model: str = "Llama-2-7B",
        cluster: str = "8xH100 + 400G IB",
        gpus: int = 8,
        batch_M_tokens: int = 4,
    ):
        from course_lib.plan import CLUSTERS, MODELS

        self.model = widgets.Dropdown(options=[*MODELS, CUSTOM], value=model, description="model")
        self.layers = widgets.IntSlider(
            value=32, min=4, max=128, step=4, description="layers", continuous_update=False
        )
        self.hidden = widgets.IntSlider(
            value=4096,
            min=1024,
            max=16384,
            step=1024,
            description="hidden",
            continuous_update=False,
        )
        self.seq = widgets.Dropdown(options=SEQ_LENGTHS, value=4096, description="seq")
        self.cluster = widgets.Dropdown(
            options=list(CLUSTERS), value=cluster, description="cluster"
        )
        self.gpus = widgets.Dropdown(
            options=[1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024], value=gpus, description="GPUs"
        )
        self.batch = widgets.Dropdown(
            options=[1, 2, 4, 8, 16],
            value=batch_M_tokens,
            description="batch (Mi tok)",
            style={"description_width": "initial"},  # the whole label, not "batch (Mi…"
        )
        # a preset fixes its shape: layers and hidden apply to "custom" only and are hidden
        # otherwise; seq applies to every model and starts at the preset's own length
        self.model.observe(lambda _change: self._model_changed(), names="value")
        self._model_changed()
        super().__init__(
            widgets.VBox([self.model, self.layers, self.hidden, self.seq]),
            widgets.VBox([self.cluster, self.gpus, self.batch]),
            tooltip="plan the run",
            intro="Pick a model (or custom + sliders), a cluster and a batch, then Run.",
        )

    def _model_changed(self) -> None:
        """Show the shape sliders for "custom" only; a preset sets seq to its own length."""
        from course_lib.plan import model

        custom = self.model.value == CUSTOM
        for slider in (self.layers, self.hidden):
            slider.layout.display = None if custom else "none"
        if not custom:
            own = model(self.model.value).seq
            self.seq.options = sorted({*SEQ_LENGTHS, own})
            self.seq.value = own

    def spec(self):
        """The ModelSpec the controls describe: a preset at the chosen seq, or a custom one
        (Llama-shaped, 128-wide heads) from the sliders."""
        from dataclasses import replace

        from course_lib.plan import ModelSpec, model

        if self.model.value != CUSTOM:
            return replace(model(self.model.value), seq=int(self.seq.value))
        h = int(self.hidden.value)
        return ModelSpec(
            "custom",
            int(self.layers.value),
            h,
            h // 128,
            max(1, h // 1024),
            (8 * h // 3 + 255) // 256 * 256,
            32000,
            int(self.seq.value),
        )

    def compute(self):
        from course_lib.units.u14_planning_a_run.run import plan_run

        spec = self.spec()
        tokens = int(self.batch.value) * 2**20
        tokens -= tokens % spec.seq
        return plan_run(
            spec,
            self.cluster.value,
            gpus=int(self.gpus.value),
            global_batch_tokens=tokens,
            total_tokens=None,
        )

    def summary(self, result) -> str:
        import html

        from course_lib.plan import explain
        from course_lib.viz.style import wrap

        # wrapped here, between words, as the lecture prints it: a page without the course's
        # style (the saved snapshot, the site) would otherwise wrap it anywhere
        return "<pre>" + html.escape(wrap(explain(result, families=5), indent="    ")) + "</pre>"

    def show(self, result):
        from course_lib.units.u14_planning_a_run.plots import plot_top_memory
        from course_lib.units.u14_planning_a_run.run import top_plans

        if result.empty:
            return []
        return [top_plans(result, 8), plot_top_memory(result, n=3)]
