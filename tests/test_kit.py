"""course_lib.kit: typed rows become frames with the row's fields as columns, in order."""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest

from course_lib import kit


@dataclasses.dataclass(frozen=True)
class Step:
    rank: int
    seconds: float
    name: str = "a"


@dataclasses.dataclass
class Loose:
    rank: int


def test_a_frame_has_one_column_per_field_in_order():
    df = kit.frame([Step(0, 1.5), Step(1, 2.5, "b")])
    assert list(df.columns) == ["rank", "seconds", "name"]
    pd.testing.assert_frame_equal(
        df, pd.DataFrame({"rank": [0, 1], "seconds": [1.5, 2.5], "name": ["a", "b"]})
    )


def test_an_empty_frame_keeps_its_columns_and_needs_its_type():
    assert list(kit.frame([], Step).columns) == ["rank", "seconds", "name"]
    with pytest.raises(ValueError, match="row_type"):
        kit.frame([])


def test_rows_are_frozen_dataclasses_of_one_type():
    with pytest.raises(TypeError, match="frozen"):
        kit.frame([Loose(0)])
    with pytest.raises(TypeError, match="dataclass"):
        kit.columns(dict)
    with pytest.raises(TypeError, match=r"rows\[1\] = Loose: expected Step"):
        kit.frame([Step(0, 1.0), Loose(1)])


def test_a_read_column_that_is_no_field_is_named():
    assert kit.reads_violations("m", {Step: ("rank", "seconds")}) == []
    (found,) = kit.reads_violations("m", {Step: ("rank", "secs")})
    assert "m reads 'secs' of Step" in found and "'seconds'" in found


@dataclasses.dataclass(frozen=True)
class Ratio:
    measured: float
    ratio: float = dataclasses.field(metadata=kit.column("measured / predicted"))


def test_a_field_may_name_a_column_that_is_no_python_name():
    assert kit.columns(Ratio) == ("measured", "measured / predicted")
    df = kit.frame([Ratio(2.0, 0.5)])
    assert df.to_dict("records") == [{"measured": 2.0, "measured / predicted": 0.5}]
    assert kit.reads_violations("m", {Ratio: ("measured / predicted",)}) == []
    with pytest.raises(TypeError, match="name = ''"):
        kit.column("")


# ---- sweep, grid, one_thread ----------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Cell:
    batch: int
    width: int
    product: int


def _cell(batch, width):
    return Cell(batch, width, batch * width)


def test_a_grid_varies_its_first_axis_slowest():
    assert kit.grid(a=(1, 2), b=list("xy")) == [
        {"a": 1, "b": "x"},
        {"a": 1, "b": "y"},
        {"a": 2, "b": "x"},
        {"a": 2, "b": "y"},
    ]
    with pytest.raises(TypeError, match="b = 'xy': expected a sequence"):
        kit.grid(a=(1,), b="xy")


def test_a_sweep_frames_the_rows_of_every_configuration_in_order():
    df = kit.sweep(_cell, kit.grid(width=(2, 3), batch=(5, 7)), Cell)
    assert list(df.columns) == ["batch", "width", "product"]
    assert df.values.tolist() == [[5, 2, 10], [7, 2, 14], [5, 3, 15], [7, 3, 21]]


def test_a_worker_may_return_several_rows_or_none():
    def two_or_none(n):
        return None if n == 0 else [Cell(n, 1, n), Cell(n, 2, 2 * n)]

    df = kit.sweep(two_or_none, [{"n": 0}, {"n": 4}], Cell)
    assert df["product"].tolist() == [4, 8]
    assert list(kit.sweep(two_or_none, [{"n": 0}], Cell).columns) == ["batch", "width", "product"]


def test_a_sweep_names_what_is_wrong():
    with pytest.raises(TypeError, match="worker.s result = dict: expected a Cell"):
        kit.sweep(lambda: {"batch": 1}, [{}], Cell)
    with pytest.raises(TypeError, match="worker.s result = Step: expected a Cell"):
        kit.sweep(lambda: Step(0, 1.0), [{}], Cell)
    with pytest.raises(TypeError, match=r"configs\[0\] = \(1, 2\): expected a mapping"):
        kit.sweep(_cell, [(1, 2)], Cell)
    with pytest.raises(TypeError, match="launch options = .*expected world_size"):
        kit.sweep(_cell, [], Cell, timeout=5.0)
    with pytest.raises(ValueError, match="world_size"):
        kit.sweep(_cell, [], Cell, world_size=0)
    with pytest.raises(TypeError, match="frozen"):
        kit.sweep(_cell, [], Loose)


def _rank_cell(rank, world_size, scale):
    return Cell(rank, world_size, rank * scale) if rank > 0 else None


@pytest.mark.slow  # starts ranks twice
def test_on_ranks_every_rank_s_rows_come_in_rank_order():
    df = kit.sweep(_rank_cell, kit.grid(scale=(10, 100)), Cell, world_size=3, timeout=60.0)
    assert df.values.tolist() == [[1, 3, 10], [2, 3, 20], [1, 3, 100], [2, 3, 200]]


def test_one_thread_sets_one_thread_and_restores_the_count():
    import torch

    before = torch.get_num_threads()
    with kit.one_thread():
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before

    @kit.one_thread()
    def threads():
        return torch.get_num_threads()

    assert threads() == 1 and torch.get_num_threads() == before


# ---- figures ----------------------------------------------------------------------------------
def test_bars_beside_puts_the_estimate_left_of_the_measurement():
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    bars = kit.bars_beside(ax, ["a", "b"], [2048, 1024], [4096, 0], scale=1024, color="red")
    heights = sorted((p.get_x() + p.get_width() / 2, p.get_height()) for p in ax.patches)
    assert heights == [(-0.2, 2.0), (0.2, 4.0), (0.8, 1.0), (1.2, 0.0)]
    assert [b.get_height() for b in bars] == [4.0, 0.0]
    assert ax.patches[0].get_hatch() == "//" and [t.get_text() for t in ax.get_xticklabels()] == [
        "a",
        "b",
    ]
    assert ax.get_legend_handles_labels()[1] == ["predicted (estimate)", "measured"]
    with pytest.raises(ValueError, match="measured = 1 values: expected 2"):
        kit.bars_beside(ax, ["a", "b"], [1, 2], [1])
    plt.close(fig)


def test_line_beside_draws_a_dashed_estimate_and_measured_markers():
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    kit.line_beside(ax, [1, 2], [10, 20], [12, 18], color="blue", scale=2, names=(None, "m"))
    pred, meas = ax.get_lines()
    assert pred.get_linestyle() == "--" and list(pred.get_ydata()) == [5.0, 10.0]
    assert meas.get_marker() == "o" and list(meas.get_ydata()) == [6.0, 9.0]
    assert ax.get_legend_handles_labels()[1] == ["m"]
    plt.close(fig)


@pytest.mark.slow  # a fresh interpreter imports torch
def test_the_kit_loads_matplotlib_only_when_a_figure_is_asked_for():
    import subprocess
    import sys

    code = (
        "import sys; from course_lib import kit; assert 'matplotlib' not in sys.modules; "
        "kit.bars_beside; assert 'matplotlib' in sys.modules; "
        "from course_lib.viz.compare import line_beside; assert kit.line_beside is line_beside"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    with pytest.raises(AttributeError, match="has no attribute 'bars'"):
        kit.bars  # noqa: B018


# ---- check tables -----------------------------------------------------------------------------
def _check_double(fn, *, task):
    got = fn(3)
    if got != 6:
        raise AssertionError(f"✗ task {task}: double(3) should be 6, yours gives {got}")
    print(f"✓ task {task}: double is right")


def _double(x):
    return 2 * x


def _triple(x):
    return 3 * x


def test_a_check_table_passes_when_every_answer_gets_its_line():
    said = kit.check_table(
        _check_double,
        [(_double, "✓ task 2: double is right"), (_triple, r"✗ task 2: .* yours gives 9")],
        task=2,
    )
    assert said == ["✓ task 2: double is right", "✗ task 2: double(3) should be 6, yours gives 9"]


def test_a_check_table_names_the_row_whose_outcome_differs():
    with pytest.raises(AssertionError, match=r"table\[0\] \(_triple\): expected '✓"):
        kit.check_table(_check_double, [(_triple, "✓ task 1")], task=1)
    with pytest.raises(AssertionError, match=r"table\[1\] \(_double\): .* the check passed"):
        kit.check_table(_check_double, [(_double, "✓"), (_double, "✗ task 1")], task=1)
    with pytest.raises(AssertionError, match=r"failed with '✗ task 1: double\(3\)"):
        kit.check_table(_check_double, [(_triple, "✗ task 1: something else")], task=1)
    with pytest.raises(ValueError, match="expected to start with ✓ or ✗"):
        kit.check_table(_check_double, [(_double, "task 1")], task=1)
