"""Unit 06's "Explore" widget (notebooks/06_activation_checkpointing.ipynb).

PolicyExplorer: choose the batch, the sequence length, a policy and its k; Run applies the policy
to the tiny GPT and measures it beside no checkpointing (kept bytes, FLOPs, gradients).

    ex = PolicyExplorer(); ex.policy.value = "segments"; ex.k.value = 2; ex.run_button.click(); ex.result
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import ipywidgets as widgets

from course_lib.viz.widgets import Explorer

if TYPE_CHECKING:
    from course_lib.models import GPTConfig


class PolicyExplorer(Explorer):
    """Batch, sequence, policy and k + Run; ``result`` holds the last ``policy_table``."""

    busy = "measuring..."
    expected_errors = (ValueError,)

    def __init__(self, *, config: GPTConfig | None = None) -> None:
        from course_lib.techniques.checkpointing import POLICIES
        from course_lib.units.u06_activation_checkpointing.run import CONFIG

        self.config = config or CONFIG
        self.batch = widgets.IntSlider(value=4, min=1, max=16, description="batch")
        self.seq = widgets.IntSlider(
            value=self.config.block_size,
            min=8,
            max=self.config.block_size,
            step=8,
            description="seq",
        )
        self.policy = widgets.Dropdown(
            options=[p for p in POLICIES if p != "none"], value="full", description="policy"
        )
        self.k = widgets.IntSlider(value=1, min=1, max=self.config.n_layer, description="k")
        super().__init__(
            widgets.VBox([self.batch, self.seq]),
            widgets.VBox([self.policy, self.k]),
            tooltip="measure the policy beside no checkpointing",
            intro="Pick a policy (k: spacing for every_k, segment length for segments), then press Run.",
        )

    def compute(self) -> Any:
        from course_lib.techniques.checkpointing import MATMUL_OPS
        from course_lib.units.u06_activation_checkpointing.run import CASES, Case, policy_table

        policy, k = self.policy.value, int(self.k.value)  # measured beside CASES[0], "none"
        cases: tuple[Case, ...] = (CASES[0], (f"{policy} k={k}", policy, k, MATMUL_OPS))
        return policy_table(
            self.config, batch=int(self.batch.value), seq=int(self.seq.value), cases=cases
        )

    def summary(self, df: Any) -> str:
        row = df.iloc[-1]
        return (
            f"{row['case']}: keeps {row['kept_vs_none']:.0%} of the bytes, {row['flops_ratio']:.3f}x "
            f"the FLOPs; residual {int(row['kept_residual'])} B; max gradient difference "
            f"{row['max_grad_error']:.1g}"
        )

    def show(self, df: Any) -> list[Any]:
        from course_lib.units.u06_activation_checkpointing.plots import plot_policies

        return [plot_policies(df)]
