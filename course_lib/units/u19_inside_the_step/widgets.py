"""Unit 19's "Explore" widget (notebooks/19_inside_the_step.ipynb).

FlashExplorer: pick a sequence length, a tile size and causal or not; Run measures, with
MemoryMeter, what FlashAttention and the written-out attention keep for backward and their peak
over forward + backward. Nothing runs until Run is pressed.

    ex = FlashExplorer(); ex.seq.value = 256; ex.run_button.click(); ex.result
"""

from __future__ import annotations

import ipywidgets as widgets

from course_lib.viz.widgets import Explorer

__all__ = ["FlashExplorer"]

_WIDE = {"description_width": "initial"}  # the whole label, not cut to 90 px


class FlashExplorer(Explorer):
    """sequence + block size + causal + Run; ``result`` is ``run.attention_memory``'s row as a dict."""

    busy = "measuring both attentions..."
    expected_errors = (ValueError,)

    def __init__(self, *, seq: int = 256, block_size: int = 64, causal: bool = True):
        self.seq = widgets.Dropdown(
            options=(64, 128, 256, 512), value=seq, description="sequence (tokens)", style=_WIDE
        )
        self.block_size = widgets.Dropdown(
            options=(16, 32, 64, 128), value=block_size, description="block_size", style=_WIDE
        )
        self.causal = widgets.Checkbox(value=causal, description="causal")
        super().__init__(
            self.seq,
            self.block_size,
            self.causal,
            tooltip="measure FlashAttention and the written-out attention with MemoryMeter",
            intro=(
                "Pick a sequence length and a tile size, then press Run (2 heads of 32, float32). "
                "Plotted: the bytes each attention keeps for backward and its peak over forward "
                "and backward, measured; the status line: how many times more the written-out "
                "attention keeps."
            ),
        )

    def compute(self):
        import dataclasses

        from course_lib.units.u19_inside_the_step.run import attention_memory

        return dataclasses.asdict(
            attention_memory(
                int(self.seq.value),
                block_size=int(self.block_size.value),
                causal=bool(self.causal.value),
            )
        )

    def summary(self, result) -> str:
        ratio = result["naive_saved_bytes"] / result["flash_saved_bytes"]
        return (
            f"flash keeps <b>{result['flash_saved_bytes'] / 2**10:,.1f} KiB</b> for backward, "
            f"the written-out attention <b>{result['naive_saved_bytes'] / 2**10:,.1f} KiB</b> "
            f"({ratio:.1f}x)"
        )

    def show(self, result):
        from course_lib.units.u19_inside_the_step.plots import plot_flash_point

        return [plot_flash_point(result)]
