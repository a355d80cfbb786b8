"""Unit 13 plots (pure, headless) and the sweep explorer widget, driven from Python."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from course_lib.units.u13_interconnects_and_backends import checks as G  # noqa: E402
from course_lib.units.u13_interconnects_and_backends import plots as P  # noqa: E402
from course_lib.units.u13_interconnects_and_backends import run as E  # noqa: E402
from course_lib.units.u13_interconnects_and_backends.widgets import (  # noqa: E402
    SweepExplorer,
    residual_table,
)


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


@pytest.fixture
def recorded():
    return G.load_sweep().assign(backend="gloo")


def test_plot_sweep_draws_measured_fit_and_ceiling(recorded):
    fits = E.fit_sweep(recorded)
    fig = P.plot_sweep(recorded, fits, ceiling_GBps=5.0)
    ax_t, ax_b = fig.axes
    labels_t = [line.get_label() for line in ax_t.get_lines()]
    assert sum("measured" in label for label in labels_t) == 6
    assert sum("alpha-beta fit" in label for label in labels_t) == 6
    ceiling = [line for line in ax_b.get_lines() if "memcpy" in line.get_label()]
    assert len(ceiling) == 1 and ceiling[0].get_ydata()[0] == 5.0
    # the measured points are the data, in ms
    first = ax_t.get_lines()[0]
    g = recorded[(recorded.collective == "all_reduce") & (recorded.world_size == 2)]
    np.testing.assert_allclose(first.get_ydata(), g.sort_values("size_bytes")["time_s"] * 1e3)
    assert ax_t.get_xscale() == "log" and ax_b.get_yscale() == "log"


def test_plot_sweep_refuses_bad_input(recorded):
    with pytest.raises(ValueError, match="busbw_GBps"):
        P.plot_sweep(recorded.drop(columns=["busbw_GBps"]))
    with pytest.raises(ValueError, match="empty"):
        P.plot_sweep(recorded.iloc[:0])
    with pytest.raises(TypeError, match="DataFrame"):
        P.plot_sweep(recorded.to_dict())


def test_plot_link_times_one_bar_per_link_and_model():
    table = E.gradient_allreduce_table((1e9, 7e9))
    fig = P.plot_link_times(table)
    ax = fig.axes[0]
    assert len(ax.patches) == len(table)
    widths = sorted(round(p.get_width(), 6) for p in ax.patches)
    assert widths == sorted(round(t * 1e3, 6) for t in table["time_s"])


def test_the_explorers_table_shows_ms_percent_and_gbps_rounded():
    import pandas as pd

    res = pd.DataFrame(
        {
            "size_bytes": [1024, 2048],
            "time_s": [0.000384123, 0.0012345],
            "predicted_s": [0.000251499, 0.0011],
            "residual_pct": [34.554295, -10.891],
            "busbw_GBps": [0.00266612, 1.6589],
            "collective": ["all_reduce", "all_reduce"],
        }
    )
    table = residual_table(res)
    assert list(table.columns) == [
        "size_bytes",
        "time_ms",
        "predicted_ms",
        "residual_pct",
        "busbw_GBps",
    ]
    assert table.to_dict("list") == {
        "size_bytes": [1024, 2048],
        "time_ms": [0.384, 1.234],
        "predicted_ms": [0.251, 1.1],
        "residual_pct": [34.6, -10.9],
        "busbw_GBps": [0.0027, 1.6589],
    }


@pytest.mark.slow
def test_sweep_explorer_runs_only_on_the_button():
    ex = SweepExplorer()
    ex.collective.value = "all_gather"
    ex.world_size.value = 2
    ex.sizes.value = (1024, 8192)
    ex.repeat.value = 2
    assert ex.result is None  # changing controls measures nothing
    cfg = ex.config()
    assert cfg.collectives == ("all_gather",) and cfg.sizes() == [1024, 2048, 4096, 8192]
    ex.run_button.click()
    assert ex.result is not None
    assert ex.result["size_bytes"].tolist() == [1024, 2048, 4096, 8192]
    assert set(ex.result["collective"]) == {"all_gather"}
    assert set(ex.result["world_size"]) == {2}
    assert len(ex.fits) == 1 and len(ex.residuals) == 4
    assert "all_gather on 2 gloo ranks, 4 sizes" in ex.status.value
    assert not ex.run_button.disabled
    assert ex.figure is not None


def test_sweep_explorer_rejects_a_range_without_two_sizes():
    with pytest.raises(ValueError, match="max_bytes"):
        SweepExplorer(max_bytes=1024)
