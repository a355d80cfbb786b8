"""course_lib.viz.widgets.Explorer: the frame of every unit's widget, driven from Python."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import base64  # noqa: E402

import ipywidgets as widgets  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

import course_lib.viz.widgets  # noqa: E402
from course_lib.viz.widgets import Explorer  # noqa: E402

PREVIOUS = ({"output_type": "stream", "name": "stdout", "text": "the previous run's picture"},)


class Square(Explorer):
    """n -> n * n; n < 0 cannot run (expected), n == 0 is a bug (unexpected)."""

    busy = "squaring..."
    expected_errors = (ValueError,)
    extras = ("doubled",)

    def __init__(self):
        self.n = widgets.IntSlider(value=3, min=-2, max=9, description="n")
        self.shown = 0
        super().__init__(self.n, tooltip="square n")

    def compute(self):
        n = self.n.value
        if n < 0:
            raise ValueError(f"n must be >= 0, got n={n} <here>")
        if n == 0:
            raise ZeroDivisionError("division by zero\nsecond line of the message")
        self.doubled = 2 * n
        return n * n

    def summary(self, result):
        return f"n squared is <b>{result}</b>"

    def show(self, result):
        self.shown += 1
        fig, ax = plt.subplots()
        ax.bar([0], [result])
        plt.figure()  # a stray figure show() does not return: the base closes it too
        return [fig, {"n": self.n.value, "square": result}]


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


@pytest.fixture
def displayed(monkeypatch):
    """What the explorer passes to IPython's display, with whether a Figure was still open."""
    seen = []

    def fake_display(obj, **kwargs):
        seen.append((obj, plt.fignum_exists(obj.number) if isinstance(obj, Figure) else None))

    monkeypatch.setattr(course_lib.viz.widgets, "display", fake_display)
    return seen


def test_frame_holds_the_controls_the_button_the_status_and_the_output(displayed):
    ex = Square()
    assert ex.result is None and ex.doubled is None  # nothing runs before Run
    note, row, status, output = ex.widget.children
    assert list(row.children) == [ex.n, ex.run_button]
    # a stored copy says that running the cell connects it (issue 26 item 2); the note and the
    # relabelled button show only on views JupyterLab marks as disconnected
    assert note is ex.stored_note and "Run this cell" in note.value
    assert ".jupyter-widgets-disconnected .course-stored-note{display:block" in note.value
    assert ".course-stored-note{display:none}" in note.value
    assert "course-run" in ex.run_button._dom_classes
    assert status is ex.status and output is ex.output
    assert ex.run_button.tooltip == "square n" and "press Run" in ex.status.value
    assert displayed == []


def test_a_saved_widget_shows_its_note_and_no_red_mark_on_each_control():
    """Issue 52 item 3: JupyterLab drew 7-15 red "disconnected" marks on a saved widget; the
    stored note's style hides ipywidgets' mark (the ::before of each disconnected view)."""
    rule = ".jupyter-widgets.jupyter-widgets-disconnected::before{display:none;content:none}"
    assert rule in Square().stored_note.value


def test_shown_it_runs_once_at_its_settings_and_adds_a_snapshot_for_pages_without_a_kernel(
    displayed,
):
    """Issue 52 item 2: a static page or slide cannot run a cell. Shown, an explorer runs at its
    default settings; after the widget come its status line and pictures as plain outputs, under
    one line saying that the live version runs in JupyterLab."""
    ex = Square()
    ex._ipython_display_()  # as `ex` ending a cell does
    assert ex.result == 9 and ex.shown == 1  # the default settings, run once
    widget, head, picture, table = [obj for obj, _ in displayed]
    view = widget["application/vnd.jupyter.widget-view+json"]
    assert view["model_id"] == ex.widget.model_id
    assert 'class="course-snapshot"' in head["text/html"]
    assert course_lib.viz.widgets.LIVE_NOTE in head["text/plain"]
    assert "runs in JupyterLab" in course_lib.viz.widgets.LIVE_NOTE
    assert "n squared is <b>9</b>" in head["text/html"]
    assert head["text/plain"].endswith("n squared is 9")
    assert base64.b64decode(picture["image/png"])[:4] == b"\x89PNG"
    assert table["text/plain"] == "{'n': 3, 'square': 9}"
    assert [o["data"] for o in ex.output.outputs] == [picture, table]  # the widget shows the same
    displayed.clear()
    ex.widget._ipython_display_()  # `ex.widget` ending a cell: the same, without a second run
    assert ex.shown == 1 and len(displayed) == 4


def test_a_good_run_stores_the_result_and_shows_it(displayed):
    ex = Square()
    ex.n.value = 4
    ex.run_button.click()
    assert ex.result == 16 and ex.doubled == 8
    assert ex.status.value == "n squared is <b>16</b>"
    assert not ex.run_button.disabled
    assert ex.shown == 1
    assert displayed == []  # nothing displayed while capturing: the outputs are the widget's state
    png, table = ex.output.outputs  # in show()'s order
    assert png["output_type"] == "display_data" and png["data"]["text/plain"].startswith("<Figure")
    assert base64.b64decode(png["data"]["image/png"])[:4] == b"\x89PNG"
    assert table["data"]["text/plain"] == "{'n': 4, 'square': 16}"
    assert plt.get_fignums() == []  # shown figures and the stray one are closed
    assert ex.run(render=False) == 16 and ex.shown == 1  # render=False draws nothing
    assert ex.output.outputs == ()
    assert ex.status.value == "n squared is <b>16</b>"


def test_the_button_is_disabled_while_compute_runs():
    seen = []

    class Probe(Square):
        def compute(self):
            seen.append((self.run_button.disabled, self.status.value))
            return super().compute()

    Probe().run()
    assert seen == [(True, "squaring...")]


def test_an_expected_error_says_cannot_run_and_clears_the_last_result():
    ex = Square()
    ex.run()
    assert len(ex.output.outputs) == 2  # the good run's picture and table, as the widget's state
    ex.n.value = -1
    assert ex.run() is None  # not raised
    assert ex.status.value == "<b>cannot run:</b> n must be &gt;= 0, got n=-1 &lt;here&gt;"
    assert ex.result is None and ex.doubled is None
    assert ex.output.outputs == ()
    assert not ex.run_button.disabled
    ex.n.value = 2
    ex.run_button.click()  # still usable
    assert ex.result == 4 and "squared" in ex.status.value


def test_an_unexpected_error_is_shown_then_raised_and_clears_the_last_result():
    ex = Square()
    ex.run()
    ex.output.outputs = PREVIOUS
    ex.n.value = 0
    with pytest.raises(ZeroDivisionError, match="division by zero"):
        ex.run()
    assert ex.status.value == "<b>error:</b> ZeroDivisionError: division by zero"  # first line only
    assert ex.result is None and ex.doubled is None
    assert ex.output.outputs == ()
    assert not ex.run_button.disabled


def test_an_error_while_drawing_is_an_error_of_the_run():
    class BadPlot(Square):
        def show(self, result):
            plt.figure()
            raise KeyError("no such column")

    ex = BadPlot()
    with pytest.raises(KeyError):
        ex.run()
    assert ex.result is None and ex.status.value.startswith("<b>error:</b> KeyError")
    assert plt.get_fignums() == [] and not ex.run_button.disabled


def test_a_subclass_without_compute_says_so():
    with pytest.raises(NotImplementedError, match="Bare must define compute"):
        type("Bare", (Explorer,), {})().run()
