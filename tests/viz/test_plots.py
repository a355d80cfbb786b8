"""Shared plots: draw headless, show what they claim, reject bad input."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from course_lib import MemoryMeter  # noqa: E402
from course_lib.models import MLP, MLPConfig  # noqa: E402
from course_lib.viz.plots import (  # noqa: E402
    CATEGORY_COLORS,
    STYLE,
    plot_measured_vs_predicted,
    plot_memory_timeline,
)


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


@pytest.fixture(scope="module")
def timeline():
    model = MLP(MLPConfig(in_features=16, hidden=(32,), out_features=4))
    opt = torch.optim.Adam(model.parameters())
    x = torch.randn(64, 16)
    with MemoryMeter(model, opt) as mem:
        model(x).pow(2).mean().backward()
        opt.step()
    return mem.timeline


def test_measured_vs_predicted_bars_and_residual():
    predicted = {
        "params": 4 * 2**20,
        "grads": 4 * 2**20,
        "optimizer": 8 * 2**20,
        "total": 16 * 2**20,
    }
    measured = {
        "params": 4 * 2**20,
        "grads": 4 * 2**20,
        "optimizer": 8 * 2**20 + 1024,
        "activations": 2**20,
        "other": 0,
    }
    fig = plot_measured_vs_predicted(measured, predicted, title="check")
    ax = fig.axes[0]
    assert ax.get_title() == "check"
    # 3 predicted segments + 4 measured segments (zero categories are not drawn)
    assert len(ax.patches) == 7
    heights = sorted(round(p.get_height(), 6) for p in ax.patches)
    assert heights == pytest.approx(sorted([4, 4, 8, 4, 4, 8 + 1024 / 2**20, 1]), abs=1e-6)
    text = "\n".join(t.get_text() for t in ax.texts)
    assert "optimizer: +1.00 KiB" in text and "activations: +1.00 MiB" in text
    assert {t.get_text() for t in ax.get_legend().get_texts()} == {
        "params",
        "grads",
        "optimizer",
        "activations",
    }
    colors = {p.get_facecolor() for p in ax.patches}
    assert matplotlib.colors.to_rgba(CATEGORY_COLORS["params"]) in colors
    assert (
        ax.xaxis.label.get_size() == STYLE["axes.labelsize"]
        or ax.yaxis.label.get_size() == STYLE["axes.labelsize"]
    )


def test_measured_vs_predicted_bad_input():
    with pytest.raises(TypeError, match="measured must be a dict"):
        plot_measured_vs_predicted([1, 2], {})
    with pytest.raises(TypeError, match=r"predicted\['params'\] must be a number"):
        plot_measured_vs_predicted({}, {"params": "4"})
    with pytest.raises(ValueError, match="unit = 'mib': expected one of .*MiB"):
        plot_measured_vs_predicted({}, {}, unit="mib")


def test_memory_timeline_from_a_real_meter(timeline):
    fig = plot_memory_timeline(timeline, title="one step", unit="KiB")
    ax = fig.axes[0]
    assert ax.get_title() == "one step" and ax.get_ylabel() == "KiB"
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert {"forward", "backward", "step"} <= set(labels)  # phases shaded
    assert {"params", "grads", "optimizer", "activations"} <= set(labels)
    assert any(t.get_text().startswith("peak ") for t in ax.texts)
    assert ax.get_xlim() == (-0.5, len(timeline) - 0.5)


def test_memory_timeline_bad_input(timeline):
    with pytest.raises(TypeError, match="timeline must be a pandas DataFrame"):
        plot_memory_timeline({"a": 1})
    with pytest.raises(ValueError, match="missing columns"):
        plot_memory_timeline(pd.DataFrame({"x": [1]}))
    with pytest.raises(ValueError, match="timeline is empty"):
        plot_memory_timeline(timeline.iloc[:0])


@pytest.mark.timeout(180)
def test_every_plot_cell_shows_its_figure_in_a_real_kernel(tmp_path):
    """Regression: the first course plot used to resolve matplotlib's backend inside
    rc_context, after which Jupyter's inline backend showed no later figure."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    v4 = nbformat.v4
    nb = v4.new_notebook(
        cells=[
            v4.new_code_cell("from course_lib.viz.plots import plot_measured_vs_predicted as plot"),
            v4.new_code_cell("plot({'params': 1, 'grads': 2}, {'params': 1, 'grads': 2});"),
            v4.new_code_cell("plot({'params': 3, 'grads': 2}, {'params': 1, 'grads': 2});"),
            v4.new_code_cell("import matplotlib.pyplot as plt\nplt.plot([1, 2]);"),
        ]
    )
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nbclient.NotebookClient(
        nb, timeout=120, resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    shown = [
        sum(
            o.get("output_type") == "display_data" and "image/png" in o.get("data", {})
            for o in cell.outputs
        )
        for cell in nb.cells
    ]
    assert shown == [0, 1, 1, 1], shown
