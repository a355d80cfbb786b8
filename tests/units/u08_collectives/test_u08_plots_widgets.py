"""Unit 08 plots (pure, headless) and the CollectiveExplorer widget, driven from Python."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from course_lib.units.u08_collectives import plots as P  # noqa: E402
from course_lib.units.u08_collectives import run as E  # noqa: E402


def _rows(n: int):
    return [torch.tensor([10.0 * r + c for c in range(n)]) for r in range(n)]


def _texts(fig: Figure) -> list[str]:
    return [t.get_text() for ax in fig.axes for t in ax.texts]


def test_before_after_draws_every_value_and_blank_for_empty():
    before = _rows(3)
    after = E.expected_after("scatter", 3)  # one value per rank, the rest NaN
    fig = P.plot_before_after(before, after, "scatter", bytes_sent=[8, 0, 0])
    texts = _texts(fig)
    assert len(texts) == 9 + 3  # NaN cells carry no label
    assert {"0", "1", "2"} <= set(texts)
    assert "rank 0  (8 B on the wire)" in [t.get_text() for t in fig.axes[1].get_yticklabels()]
    plt.close(fig)


@pytest.mark.slow
def test_primitives_grid_has_a_before_and_after_panel_per_collective():
    results = {
        name: {"before": _rows(4), "after": E.expected_after(name, 4)} for name in E.PRIMITIVES
    }
    fig = P.plot_primitives(results)
    titles = [ax.get_title() for ax in fig.axes if ax.get_visible()]
    assert titles.count("all_to_all: after") == 1 and len(titles) == 16
    assert "72" in _texts(fig)  # all_reduce of slot 3: 3 + 13 + 23 + 33
    plt.close(fig)


@pytest.mark.slow
def test_ring_steps_from_records_label_contributors():
    n = 3
    # hand-made records of rank r for a 3-element tensor, following ring_all_reduce's schedule
    full = float(2**n - 1)
    records = []
    for r in range(n):
        states = [torch.full((n,), float(2**r))]
        for _ in range(2 * (n - 1)):
            states.append(torch.full((n,), full))
        records.append(
            [
                {
                    "phase": "input" if s == 0 else ("reduce-scatter" if s < n else "all-gather"),
                    "step": s,
                    "sent_chunk": None if s == 0 else 0,
                    "received_chunk": None,
                    "state": st,
                }
                for s, st in enumerate(states)
            ]
        )
    fig = P.plot_ring_steps(records)
    assert len(fig.axes) == 2 * (n - 1) + 1
    labels = _texts(fig)
    assert labels.count("all") == n * n * 2 * (n - 1)
    assert "1" in labels and "2" in labels and "0" in labels
    plt.close(fig)


def test_bytes_and_times_plots():
    df = pd.DataFrame(
        {
            "algorithm": ["ring", "ring", "naive_ring", "naive_ring"],
            "rank": [0, 1, 0, 1],
            "size_bytes": [2048] * 4,
            "wire_bytes_sent": [1168, 1168, 2192, None],
            "predicted_bytes_sent": [1024, 1024, 2048, 2048],
        }
    )
    fig = P.plot_bytes(df)
    assert "KiB" in fig.axes[0].get_ylabel()
    heights = sorted(p.get_height() for p in fig.axes[0].patches)
    assert heights == [0.0, 1168 / 1024, 1168 / 1024, 2192 / 1024]  # unmeasured: no bar
    plt.close(fig)
    fig = P.plot_bytes(
        df.rename(columns={"algorithm": "collective"}), group="collective", per_size=True
    )
    assert fig.axes[0].get_ylabel() == "bytes sent / S"
    assert max(p.get_height() for p in fig.axes[0].patches) == pytest.approx(2192 / 2048)
    plt.close(fig)
    times = pd.DataFrame(
        {
            "algorithm": ["ring", "ring"],
            "size_bytes": [1024, 4096],
            "median_s": [1e-3, 2e-3],
            "p25_s": [0.9e-3, 1.9e-3],
            "p75_s": [1.1e-3, 2.2e-3],
        }
    )
    model = pd.DataFrame(
        {"algorithm": ["ring", "ring"], "size_bytes": [1024, 4096], "predicted_s": [1.1e-3, 1.8e-3]}
    )
    fig = P.plot_times(times, model)
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert labels == ["ring (alpha-beta model)", "ring (measured)"] or set(labels) == {
        "ring (measured)",
        "ring (alpha-beta model)",
    }
    plt.close(fig)


@pytest.mark.slow
def test_widget_runs_only_on_click_and_shows_the_real_result():
    from course_lib.units.u08_collectives.widgets import CollectiveExplorer

    ex = CollectiveExplorer()
    assert ex.result is None  # nothing ran at construction
    ex.collective.value = "all_to_all"
    ex.world_size.value = 3
    assert ex.result is None  # changing controls does not run anything
    ex.run_button.click()
    assert ex.result is not None
    expected = E.expected_after("all_to_all", 3)
    assert all(torch.equal(a, e) for a, e in zip(ex.result["after"], expected))
    assert list(ex.table.index) == [0, 1, 2]
    assert "all_to_all on 3 ranks" in ex.status.value
    titles = [ax.get_title() for ax in ex.figure.axes]
    assert titles == ["all_to_all: before", "all_to_all: after"]

    assert "B on the wire in all" in ex.status.value

    ex.collective.value = "ring (from scratch)"
    ex.world_size.value = 4
    ex.run_button.click()
    assert ex.table["sent, predicted (estimate)"].tolist() == [24] * 4  # 2 * 3/4 * 16 B
    # measured: the 16 B payloads plus gloo's headers, so more than the estimate on every rank
    assert (ex.table["residual (wire - predicted)"] > 0).all()
    assert ex.table["sent, measured (wire)"].tolist() == ex.result["wire_bytes_sent"]


@pytest.mark.slow
def test_widget_explains_an_impossible_choice_and_stays_usable():
    from course_lib.units.u08_collectives.widgets import CollectiveExplorer

    ex = CollectiveExplorer(collective="recursive_doubling (from scratch)", world_size=2)
    ex.run_button.click()
    assert ex.result is not None
    assert [o["data"].keys() >= {"image/png"} for o in ex.output.outputs] == [True, False]
    ex.world_size.value = 3
    ex.run_button.click()
    assert (
        ex.result is None
        and "cannot run" in ex.status.value
        and "world_size = 3: expected a power of two" in ex.status.value
    )
    assert ex.output.outputs == ()  # the 2-rank picture and table are gone, not left under it
    assert not ex.run_button.disabled
    ex.world_size.value = 2
    ex.run_button.click()
    assert ex.result is not None and len(ex.output.outputs) == 2


def test_widget_names_the_world_sizes_its_own_slider_offers():
    from course_lib.units.u08_collectives.widgets import CollectiveExplorer

    for top, listed in ((8, "2, 4, 8"), (6, "2, 4")):
        ex = CollectiveExplorer(
            collective="recursive_doubling (from scratch)", world_size=3, max_world_size=top
        )
        ex.run_button.click()
        assert ex.status.value.endswith(
            f"world_size = 3: expected a power of two ({listed}); recursive doubling needs one"
        )
        offered = range(ex.world_size.min, ex.world_size.max + 1, ex.world_size.step)
        assert listed == ", ".join(str(w) for w in offered if not w & (w - 1))  # the slider's own
        assert ex.result is None and ex.table is None and ex.figure is None


def test_widget_dropdown_is_wide_enough_for_the_longest_choice():
    import re

    from course_lib.units.u08_collectives.widgets import CollectiveExplorer

    ex = CollectiveExplorer()
    longest = max(len(c) for c in E.COLLECTIVE_CHOICES)  # "recursive_doubling (from scratch)"
    assert ex.collective.style.description_width == "initial"  # the label takes only its own width
    chars = int(re.match(r"calc\((\d+)ch", ex.collective.layout.width).group(1))
    assert chars >= longest + len(ex.collective.description)


@pytest.mark.parametrize("bad", ["allreduce"])
def test_widget_rejects_unknown_collective(bad):
    from course_lib.units.u08_collectives.widgets import CollectiveExplorer

    with pytest.raises(Exception):  # noqa: B017 - ipywidgets raises TraitError for a bad option
        CollectiveExplorer(collective=bad)
