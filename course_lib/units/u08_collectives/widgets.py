"""Explorer widget of unit 08 (notebooks/08_collectives.ipynb).

CollectiveExplorer: pick a collective (one of the eight torch.distributed primitives, or one of
our from-scratch all-reduce algorithms) and a world size; Run launches that many real ranks, runs
the collective once and shows what every rank held before and after, with the bytes each rank
sent (CommMeter) beside the estimate. Nothing runs until Run is pressed.

    ex = CollectiveExplorer(); ex.collective.value = "all_to_all"; ex.run_button.click(); ex.result
"""
from __future__ import annotations

import html

import ipywidgets as widgets
import matplotlib.pyplot as plt
import pandas as pd
from IPython.display import display

__all__ = ["CollectiveExplorer"]


class CollectiveExplorer:
    """Dropdown + world-size slider + Run; ``result`` is the last run, ``table`` its bytes."""

    def __init__(self, *, collective: str = "all_reduce", world_size: int = 4, max_world_size: int = 8):
        from course_lib.units.u08_collectives.run import COLLECTIVE_CHOICES

        self.collective = widgets.Dropdown(options=list(COLLECTIVE_CHOICES), value=collective,
                                           description="collective")
        self.world_size = widgets.IntSlider(value=world_size, min=2, max=max_world_size, step=1,
                                            description="ranks", continuous_update=False)
        self.run_button = widgets.Button(description="Run", button_style="primary",
                                         tooltip="launch the ranks and run the collective once")
        self.status = widgets.HTML(value="Pick a collective and a number of ranks, then press Run.")
        self.output = widgets.Output()
        self.result: dict | None = None
        self.table: pd.DataFrame | None = None
        self.figure = None  # the last before/after Figure (kept for tests and for saving)
        self.run_button.on_click(lambda _button: self.run())
        self.widget = widgets.VBox([widgets.HBox([self.collective, self.world_size, self.run_button]),
                                    self.status, self.output])

    def _ipython_display_(self):  # display(explorer) shows the controls
        display(self.widget)

    def run(self) -> dict | None:
        """Launch the ranks, run the chosen collective, draw before/after and the bytes table."""
        from course_lib.units.u08_collectives.plots import plot_before_after
        from course_lib.units.u08_collectives.run import bytes_table, run_primitives

        name, n = self.collective.value, int(self.world_size.value)
        self.run_button.disabled = True
        self.status.value = f"running {html.escape(name)} on {n} ranks..."
        try:
            result = run_primitives([name], n)[name]
        except ValueError as err:  # e.g. recursive doubling on 3 ranks: say why, keep going
            self.result, self.table = None, None
            self.status.value = f"<b>cannot run:</b> {html.escape(str(err))}"
            return None
        except Exception as exc:  # noqa: BLE001 - keep the widget usable, show the error
            self.status.value = f"<b>error:</b> {html.escape(type(exc).__name__)}: {html.escape(str(exc))}"
            raise
        finally:
            self.run_button.disabled = False
        self.result = result
        self.table = bytes_table(name, result, n)
        wire = self.table["sent, measured (wire)"]
        total = (html.escape(result["wire_source"][0]) if wire.isna().any() else
                 f"{int(wire.sum()):,} B on the wire in all, headers included")
        self.status.value = f"{html.escape(name)} on {n} ranks: {total} (one float32 per slot, 4 B each)"
        with self.output:
            self.output.clear_output(wait=True)
            self.figure = plot_before_after(result["before"], result["after"], name,
                                            bytes_sent=result["wire_bytes_sent"])
            display(self.figure)
            plt.close(self.figure)
            display(self.table)
        return result
