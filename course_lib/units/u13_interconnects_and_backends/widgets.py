"""Explorer widget of unit 13 (notebooks/13_interconnects_and_backends.ipynb).

SweepExplorer: pick a collective, a world size, a range of message sizes and a number of timed
iterations; Run launches a real sweep on that many ranks (gloo here, NCCL with one GPU per rank),
fits alpha and beta to it and shows the measured points beside the fit, with the residual table.
Nothing runs until Run is pressed (moving a slider only changes what the next Run measures).

    ex = SweepExplorer(); ex.collective.value = "all_gather"; ex.run_button.click(); ex.result
"""

from __future__ import annotations

import html

import ipywidgets as widgets

from course_lib import validate
from course_lib.measure.estimate import KiB, MiB, fmt_bytes
from course_lib.viz.widgets import Explorer

__all__ = ["SweepExplorer"]

_SIZES = [KiB * 2**i for i in range(19)]  # 1 KiB ... 256 MiB


class SweepExplorer(Explorer):
    """Controls + Run. After a run: ``result`` (the sweep), ``fits`` (alpha, beta),
    ``residuals`` (measured beside predicted), ``figure`` (the plot shown)."""

    busy = "measuring..."
    extras = ("fits", "residuals", "figure")

    def __init__(self, *, world_sizes=(2, 4), max_bytes: int = 256 * MiB, timeout: float = 120.0):
        from course_lib.units.u13_interconnects_and_backends.run import SWEEP_COLLECTIVES

        max_bytes = validate.count("max_bytes", max_bytes, minimum=_SIZES[1])  # 2 sizes at least
        sizes = [s for s in _SIZES if s <= max_bytes]
        self.timeout = timeout
        self.collective = widgets.Dropdown(
            options=list(SWEEP_COLLECTIVES), value="all_reduce", description="collective"
        )
        self.world_size = widgets.Dropdown(
            options=list(world_sizes), value=world_sizes[0], description="ranks"
        )
        self.sizes = widgets.SelectionRangeSlider(
            options=[(fmt_bytes(s, digits=0), s) for s in sizes],
            index=(0, min(len(sizes) - 1, 10)),
            description="sizes",
            layout=widgets.Layout(width="420px"),
        )
        self.repeat = widgets.IntSlider(value=3, min=1, max=20, description="repeat")
        super().__init__(
            widgets.VBox([self.collective, self.world_size]),
            widgets.VBox([self.sizes, self.repeat]),
            tooltip="launch the ranks and time the collective",
            intro="Choose, then press Run (nothing runs before).",
        )

    def config(self):
        """The SweepConfig the next Run will measure (sizes in factors of 2)."""
        from course_lib.units.u13_interconnects_and_backends.run import SweepConfig

        lo, hi = self.sizes.value
        return SweepConfig(
            collectives=(self.collective.value,),
            world_sizes=(int(self.world_size.value),),
            min_bytes=int(lo),
            max_bytes=int(hi),
            factor=2,
            warmup=1,
            repeat=int(self.repeat.value),
            timeout=self.timeout,
        )

    def compute(self):
        """Measure the sweep and fit alpha and beta to it."""
        from course_lib.units.u13_interconnects_and_backends.run import (
            collective_sweep,
            fit_sweep,
            sweep_residuals,
        )

        df = collective_sweep(self.config(), progress=False)
        self.fits = fit_sweep(df)
        self.residuals = sweep_residuals(df, self.fits)
        return df

    def summary(self, df) -> str:
        f = self.fits.iloc[0]
        what = (
            f"{df['collective'].iloc[0]} on {df['world_size'].iloc[0]} {df['backend'].iloc[0]} "
            f"ranks, {len(df)} sizes"
        )
        if f["beta_s_per_byte"] > 0:
            fit = (
                f"alpha = {f['alpha_s'] * 1e6:.0f} us, 1/beta = {f['algbw_fit_GBps']:.3g} GB/s "
                f"(busbw {f['busbw_fit_GBps']:.3g} GB/s)"
            )
        else:
            fit = (
                f"alpha = {f['alpha_s'] * 1e6:.0f} us, beta <= 0: the time did not grow with "
                "size in this range; widen it to larger messages to see a bandwidth"
            )
        return html.escape(f"{what}: {fit}")

    def show(self, df):
        from course_lib.units.u13_interconnects_and_backends.plots import plot_sweep

        self.figure = plot_sweep(df, self.fits)
        return [self.figure, residual_table(self.residuals)]


def residual_table(residuals):
    """The widget's table: one row per size, times in ms (3 decimals, i.e. to the microsecond),
    the residual in % and the bus bandwidth in GB/s, rounded to what a 2-core sweep resolves."""
    return residuals[["size_bytes"]].assign(
        time_ms=(residuals["time_s"] * 1e3).round(3),
        predicted_ms=(residuals["predicted_s"] * 1e3).round(3),
        residual_pct=residuals["residual_pct"].round(1),
        busbw_GBps=residuals["busbw_GBps"].round(4),
    )
