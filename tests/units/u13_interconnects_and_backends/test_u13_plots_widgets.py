"""Unit 13 plots (pure, headless) and the sweep explorer widget, driven from Python."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from course_lib.units.u13_interconnects_and_backends import checks as G  # noqa: E402
from course_lib.units.u13_interconnects_and_backends import plots as P  # noqa: E402
from course_lib.units.u13_interconnects_and_backends import run as E  # noqa: E402
from course_lib.units.u13_interconnects_and_backends.widgets import SweepExplorer  # noqa: E402


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


def _events():
    rows = []
    for rank in (0, 1):
        for i in range(3):
            rows.append({"bucket_cap_mb": 1.0, "rank": rank, "lane": "compute",
                         "name": f"backward L{2 - i}", "start": 0.01 * i,
                         "end": 0.01 * i + 0.008, "bytes": None})
        rows.append({"bucket_cap_mb": 1.0, "rank": rank, "lane": "comm", "name": "bucket 0",
                     "start": 0.012, "end": 0.03, "bytes": 100})
    return pd.DataFrame(rows)


def test_plot_ddp_timeline_one_lane_per_rank_and_kind():
    fig = P.plot_ddp_timeline(_events(), bucket_cap_mb=1.0)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == [
        "rank 0 compute", "rank 0 comm", "rank 1 compute", "rank 1 comm"]
    assert len(ax.collections) == 4  # one broken_barh per lane
    with pytest.raises(ValueError, match="bucket_cap_mb=4"):
        P.plot_ddp_timeline(_events(), bucket_cap_mb=4)


def test_plot_ddp_timeline_overlapping_buckets_get_their_own_sub_lane():
    comm = [("bucket 0", 0.010, 0.030), ("bucket 1", 0.015, 0.040), ("bucket 2", 0.020, 0.025),
            ("bucket 3", 0.032, 0.045)]  # b0, b1, b2 in flight together; b3 fits after b0
    rows = [{"rank": 0, "lane": "compute", "name": "backward L0", "start": 0.0, "end": 0.01}]
    rows += [{"rank": 0, "lane": "comm", "name": n, "start": s, "end": e} for n, s, e in comm]
    fig = P.plot_ddp_timeline(pd.DataFrame(rows))
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["rank 0 compute", "rank 0 comm"]
    boxes = [p.get_extents() for p in ax.collections[1].get_paths()]
    assert len(boxes) == 4
    for i in range(4):
        for j in range(i + 1, 4):
            (x0, y0), (x1, y1) = boxes[i].get_points()
            (u0, v0), (u1, v1) = boxes[j].get_points()
            overlap_t = min(x1, u1) - max(x0, u0) > 1e-9
            overlap_y = min(y1, v1) - max(y0, v0) > 1e-9
            assert not (overlap_t and overlap_y), f"{comm[i][0]} and {comm[j][0]} drawn on top of each other"
    lanes = sorted({round(b.get_points()[:, 1].mean(), 6) for b in boxes})
    assert len(lanes) == 3  # three buckets in flight at once -> three sub-lanes, no more
    assert sorted(t.get_text() for t in ax.texts) == ["b0", "b1", "b2", "b3"]


def test_plot_bucket_sweep_with_model_lines():
    summary = pd.DataFrame({"bucket_cap_mb": [1, 4, 25], "n_buckets": [8, 2, 1],
                            "step_time_s": [0.05, 0.04, 0.045]})
    model = pd.DataFrame({"bucket_cap_mb": [1, 4, 25], "total_comm_s": [0.02, 0.012, 0.01],
                          "tail_s": [0.002, 0.005, 0.01]})
    fig = P.plot_bucket_sweep(summary, model=model)
    ax_n, ax_t = fig.axes
    assert list(ax_n.get_lines()[0].get_ydata()) == [8, 2, 1]
    assert len(ax_t.get_lines()) == 3
    assert ax_t.get_lines()[0].get_label() == "measured step (fwd + bwd + comm)"
    fig = P.plot_bucket_sweep(summary.assign(local_step_time_s=[0.03, 0.03, 0.03]))
    np.testing.assert_allclose(fig.axes[1].get_lines()[0].get_ydata(), [20, 10, 15])
    with pytest.raises(ValueError, match="tail_s"):
        P.plot_bucket_sweep(summary, model=model.drop(columns=["tail_s"]))


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
