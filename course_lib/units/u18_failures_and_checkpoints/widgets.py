"""Explorer widget of unit 18 (notebooks/18_failures_and_checkpoints.ipynb).

GoodputExplorer: cluster size, checkpoint write bandwidth, restart time; Run computes Young's and
Daly's intervals and draws goodput against the interval for Llama 3 405B's checkpoint at Llama 3's
per-GPU failure rate. Nothing runs until Run is pressed.

    ex = GoodputExplorer(); ex.gpus.value = 32768; ex.run_button.click(); ex.result
"""

from __future__ import annotations

import ipywidgets as widgets

from course_lib.viz.widgets import Explorer

__all__ = ["GoodputExplorer"]


class GoodputExplorer(Explorer):
    """GPUs, write GB/s, restart minutes + Run; ``result`` holds ``run.scale_table`` (one row)
    and the goodput curve."""

    busy = "computing..."

    def __init__(self):
        self.gpus = widgets.SelectionSlider(
            options=[1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072],
            value=16384,
            description="GPUs",
        )
        self.write = widgets.FloatLogSlider(
            value=2000, base=10, min=1, max=4, description="write GB/s"
        )
        self.restart = widgets.IntSlider(value=10, min=1, max=60, description="restart min")
        super().__init__(
            widgets.VBox([self.gpus, self.write]),
            self.restart,
            tooltip="compute the intervals and goodput",
            intro="Llama 3 405B's checkpoint (14 B/param) at Llama 3's failure rate per GPU.",
        )

    def compute(self):
        from course_lib.units.u18_failures_and_checkpoints.run import goodput_curve, scale_table

        row = scale_table(
            [int(self.gpus.value)],
            write_GBps=float(self.write.value),
            restart_s=60.0 * int(self.restart.value),
        ).iloc[0]
        mtbf = float(row["job MTBF h"]) * 3600
        curve = goodput_curve(float(row["save s"]), mtbf, restart_s=60.0 * int(self.restart.value))
        return {"row": row, "curve": curve}

    def summary(self, res) -> str:
        r = res["row"]
        return (
            f"job MTBF {r['job MTBF h']:.2f} h, save {r['save s']:.1f} s, Young's interval "
            f"{r['Young interval min']:.1f} min, goodput {r['goodput (Young)']:.1%}"
        )

    def show(self, res):
        from course_lib.units.u18_failures_and_checkpoints.plots import plot_goodput

        r = res["row"]
        return [
            plot_goodput(
                {f"{int(r['GPUs']):,} GPUs": res["curve"]}, {"Young": r["Young interval min"] * 60}
            )
        ]
