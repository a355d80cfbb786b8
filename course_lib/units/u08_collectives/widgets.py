"""Explorer widget of unit 08 (notebooks/08_collectives.ipynb).

CollectiveExplorer: pick a collective (one of the eight torch.distributed primitives, or one of
our from-scratch all-reduce algorithms) and a world size; Run launches that many real ranks, runs
the collective once and shows what every rank held before and after, with the bytes each rank
sent on the wire (measured by CommMeter through the OS) beside the estimate. Nothing runs until Run is pressed.

    ex = CollectiveExplorer(); ex.collective.value = "all_to_all"; ex.run_button.click(); ex.result
"""

from __future__ import annotations

import html
from typing import Any

import ipywidgets as widgets

from course_lib import validate
from course_lib.viz.widgets import Explorer

__all__ = ["CollectiveExplorer"]


class CollectiveExplorer(Explorer):
    """Dropdown + world-size slider + Run; ``result`` is the last run, ``table`` its bytes,
    ``figure`` its before/after Figure (kept for tests and for saving)."""

    busy = "launching the ranks..."
    expected_errors = (ValueError,)  # e.g. recursive doubling on 3 ranks: say why, keep going
    extras = ("table", "figure")

    def __init__(
        self, *, collective: str = "all_reduce", world_size: int = 4, max_world_size: int = 8
    ):
        from course_lib.units.u08_collectives.run import COLLECTIVE_CHOICES

        longest = max(len(c) for c in COLLECTIVE_CHOICES)
        # wide enough for the longest choice, "recursive_doubling (from scratch)", and its label
        self.collective = widgets.Dropdown(
            options=list(COLLECTIVE_CHOICES),
            value=collective,
            description="collective",
            style={"description_width": "initial"},
            layout=widgets.Layout(width=f"calc({longest + 12}ch + 3em)"),
        )
        self.world_size = widgets.IntSlider(
            value=world_size,
            min=2,
            max=max_world_size,
            step=1,
            description="ranks",
            continuous_update=False,
        )
        super().__init__(
            self.collective,
            self.world_size,
            tooltip="launch the ranks and run the collective once",
            intro="Pick a collective and a number of ranks, then press Run.",
        )

    def compute(self) -> Any:
        """Launch the ranks and run the chosen collective once."""
        from course_lib.units.u08_collectives.run import bytes_table, run_primitives

        name, n = self.collective.value, int(self.world_size.value)
        if name == "recursive_doubling (from scratch)":
            lo, hi = self.world_size.min, self.world_size.max
            validate.power_of_two(
                "world_size", n, minimum=lo, maximum=hi, note="recursive doubling needs one"
            )
        result = run_primitives([name], n)[name]
        self.table = bytes_table(name, result, n)
        return result

    def summary(self, result: Any) -> str:
        wire = self.table["sent, measured (wire)"]
        total = (
            html.escape(result["wire_source"][0])
            if wire.isna().any()
            else f"{int(wire.sum()):,} B on the wire in all, headers included"
        )
        return (
            f"{html.escape(self.collective.value)} on {int(self.world_size.value)} ranks: "
            f"{total} (one float32 per slot, 4 B each)"
        )

    def show(self, result: Any) -> list[Any]:
        from course_lib.units.u08_collectives.plots import plot_before_after

        self.figure = plot_before_after(
            result["before"],
            result["after"],
            self.collective.value,
            bytes_sent=result["wire_bytes_sent"],
        )
        return [self.figure, self.table]
