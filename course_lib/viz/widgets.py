"""The frame every unit's "Explore" widget shares: a Run button, a status line and an output area.

A copy of the widget stored in a notebook says, above its controls, that running the cell
connects it, and its Run button reads "run the cell first" (:data:`STORED_NOTE`).

A unit's widget subclasses :class:`Explorer` and writes only its controls, ``compute()`` (a call
into the unit's ``run.py``) and ``show()`` (a call into the unit's ``plots.py``)::

    class SquareExplorer(Explorer):
        busy = "squaring..."                  # the status line while compute() runs
        expected_errors = (ValueError,)      # shown as "cannot run: ...", not raised
        def __init__(self):
            self.n = widgets.IntSlider(value=3, min=-2, max=9, description="n")
            super().__init__(self.n, tooltip="square n")
        def compute(self):                    # the measurement; raise to report a problem
            return unit_run.square(self.n.value)
        def summary(self, result):            # the status line (HTML) after a good run
            return f"n squared is <b>{result}</b>"
        def show(self, result):               # what the output area shows, in order
            return [unit_plots.plot_square(result)]

Driven from Python (tests do this): ``ex = SquareExplorer(); ex.n.value = 4; ex.run_button.click();
ex.result``. Nothing runs until the explorer is shown or Run is pressed. This module is the one
place in ``course_lib`` where ipywidgets frames are built.

Shown (``explorer`` or ``explorer.widget`` ending a cell, or ``display(explorer)``), an explorer
runs once at its default settings, so its output area holds that run's pictures, and after the
widget the cell gets a **snapshot**: the same status line and pictures as plain outputs (one HTML
output marked ``course-snapshot``, then the pictures), under a line saying that the live version
runs in JupyterLab. A static page or slide, where no kernel connects the controls, shows the
snapshot in place of the widget (:mod:`course_tools.publish`); JupyterLab hides it while the widget
above it is live or shows pictures of its own (the course's ``jupyter/custom/custom.css``).
"""

from __future__ import annotations

import html
import re

import ipywidgets as widgets
import matplotlib.pyplot as plt
from IPython.display import display

__all__ = ["Explorer", "LIVE_NOTE", "SNAPSHOT_CLASS", "STORED_NOTE"]

# A notebook stores each widget's last state; JupyterLab draws it on opening, but those controls
# are connected to no kernel (JupyterLab puts the class jupyter-widgets-disconnected on each such
# view, with a red mark) until the cell runs again. The rule below, stored with the widget, shows
# the note and relabels Run only in that state; a live widget shows neither.
STORED_NOTE = (
    "<style>"
    ".course-stored-note{display:none}"
    ".jupyter-widgets-disconnected .course-stored-note{display:block;padding:4px 8px;"
    "border-left:4px solid var(--jp-warn-color1,#f57c00);background:var(--jp-warn-color3,#fff3e0)}"
    ".course-run.jupyter-widgets-disconnected{font-size:0}"
    ".course-run.jupyter-widgets-disconnected::after{content:'run the cell first';"
    "font-size:var(--jp-widgets-font-size,13px)}"
    # the note says it once: no red "disconnected" mark on each control (ipywidgets' ::before)
    ".jupyter-widgets.jupyter-widgets-disconnected::before{display:none;content:none}"
    "</style>"
    "<div class='course-stored-note'>This is the widget as it was saved: its controls are not "
    "connected. <b>Run this cell</b> (Shift+Enter) to connect them, then press Run.</div>"
)


#: the class of the snapshot's first output (its line and status): the publisher and JupyterLab's
#: course style find the snapshot by it
SNAPSHOT_CLASS = "course-snapshot"
#: the snapshot's line: what it is, and where the live widget runs
LIVE_NOTE = (
    "This widget at its default settings, as run when the lecture was saved. The live version "
    "runs in JupyterLab: run the cell there, set the controls, press Run."
)


class ExplorerBox(widgets.VBox):
    """The explorer's box: shown by itself (``explorer.widget`` ending a cell), it shows the
    explorer, default run and snapshot included."""

    explorer: Explorer

    def _ipython_display_(self):
        self.explorer._ipython_display_()


class Explorer:
    """Controls + Run button + status line + output area; ``result`` holds the last good run.

    A run disables the button, calls ``compute()``, stores its return value in ``result``, sets
    the status to ``summary(result)`` and shows the objects ``show(result)`` returns in
    ``output`` (set as the Output widget's ``outputs``, never displayed while capturing, so no
    copy goes to JupyterLab's Log Console; each Figure is rendered to PNG, then closed, so
    Jupyter's inline backend never shows a second copy elsewhere). A run that fails clears ``result``, the attributes
    named in ``extras`` and the output, so no earlier result sits under the error message. An
    exception of a type in ``expected_errors`` is reported as "cannot run: ..." and ``run()``
    returns None; any other is reported as "error: ..." and raised again.
    """

    busy: str = "running..."
    expected_errors: tuple[type[BaseException], ...] = ()  # "cannot run: ...", not raised
    extras: tuple[str, ...] = ()  # other attributes a run sets: None before it and after a failure

    def __init__(
        self,
        *controls: widgets.Widget,
        tooltip: str = "run",
        intro: str = "Set the controls, then press Run.",
    ):
        self.run_button = widgets.Button(description="Run", button_style="primary", tooltip=tooltip)
        self.run_button.add_class("course-run")  # relabelled "run the cell first" when stored
        self.stored_note = widgets.HTML(value=STORED_NOTE)  # shows only in a stored copy
        self.status = widgets.HTML(value=intro)
        self.output = widgets.Output()
        self.clear()
        self.run_button.on_click(lambda _button: self.run())
        self.widget = ExplorerBox(
            [self.stored_note, widgets.HBox([*controls, self.run_button]), self.status, self.output]
        )
        self.widget.explorer = self

    def _ipython_display_(self):
        """Shown (``display(explorer)``, an explorer or its ``widget`` ending a cell): a run at
        the current settings if none has been made, the widget, then the snapshot of that run."""
        if self.result is None:
            self.run()
        display(widgets.Widget._repr_mimebundle_(self.widget), raw=True)
        for data in self.snapshot():
            display(data, raw=True)

    def snapshot(self) -> list[dict]:
        """The widget's status line and pictures as plain display data (mime bundles), under
        :data:`LIVE_NOTE`: what a page without a kernel shows in place of the widget."""
        head = (
            f'<div class="{SNAPSHOT_CLASS}"><p><em>{html.escape(LIVE_NOTE)}</em></p>'
            f"<p>{self.status.value}</p></div>"
        )
        status = html.unescape(_TAGS.sub("", _BREAK.sub("\n", self.status.value)))
        return [{"text/html": head, "text/plain": f"{LIVE_NOTE}\n{status}"}] + [
            dict(out["data"]) for out in self.output.outputs if out.get("data")
        ]

    def compute(self):
        """Run the measurement for the current controls and return the result."""
        raise NotImplementedError(f"{type(self).__name__} must define compute()")

    def summary(self, result) -> str:
        """The status line (HTML) after a good run."""
        return "done"

    def show(self, result) -> list:
        """The objects (Figures, DataFrames, ...) the output area shows after a good run."""
        return []

    def clear(self) -> None:
        """Forget the last run: ``result`` and ``extras`` back to None, output area emptied."""
        self.result = None
        for name in self.extras:
            setattr(self, name, None)
        self.output.outputs = ()

    def run(self, *, render: bool = True):
        """Run once with the current controls and return the result (None if it cannot run).

        ``render=False`` leaves the output area empty (for a notebook cell that shows
        ``result`` itself); the measurement and the status line are the same.
        """
        self.run_button.disabled = True
        self.status.value = html.escape(self.busy)
        opened = set(plt.get_fignums())
        try:
            result = self.compute()
            status = self.summary(result)
            shown = list(self.show(result)) if render else []
        except self.expected_errors as err:
            self._fail("cannot run", str(err), opened)
            return None
        except Exception as err:
            self._fail("error", f"{type(err).__name__}: {err}", opened)
            raise
        finally:
            self.run_button.disabled = False
        self.result = result
        self.status.value = status
        try:
            # One assignment of the Output widget's ``outputs``: the pictures travel as the widget's
            # own state and replace the old ones at once. Not ``with self.output: display(...)``:
            # that sends them as kernel output messages which JupyterLab routes into the widget
            # only once it has seen the widget's capture switched on; on the first Run after a
            # kernel start that switch often arrives late, and the picture lands in the Log
            # Console instead. Setting ``outputs`` here also lets a failed run clear them again.
            self.output.outputs = tuple(_display_data(obj) for obj in shown)
        finally:  # closed before the cell ends, so the inline backend never shows them again
            _close_new_figures(opened)
        return result

    def _fail(self, label: str, message: str, opened: set[int]) -> None:
        _close_new_figures(opened)
        self.clear()
        first = message.partition("\n")[0]  # a launched rank's error carries its whole traceback
        self.status.value = f"<b>{label}:</b> {html.escape(first)}"


_BREAK, _TAGS = re.compile(r"<br\s*/?>"), re.compile(r"<[^>]+>")


def _display_data(obj) -> dict:
    """``obj`` as one display_data output (what ``display(obj)`` would send). A Figure becomes a
    PNG exactly as Jupyter's inline backend renders it (``bbox_inches="tight"``, the figure's own
    dpi), whether or not the inline backend has registered its formatter yet."""
    from IPython.core.formatters import DisplayFormatter
    from IPython.core.interactiveshell import InteractiveShell
    from matplotlib.figure import Figure

    if isinstance(obj, Figure):
        from IPython.core.pylabtools import print_figure

        data = {"image/png": print_figure(obj, "png", base64=True), "text/plain": repr(obj)}
        return {"output_type": "display_data", "data": data, "metadata": {}}
    # the kernel's formatter (with any the learner registered); outside IPython a plain one, not
    # a new shell (which would open a history database)
    shell_formatter = (
        InteractiveShell.instance().display_formatter if InteractiveShell.initialized() else None
    )
    formatter = shell_formatter or DisplayFormatter()
    data, metadata = formatter.format(obj)
    return {"output_type": "display_data", "data": data, "metadata": metadata}


def _close_new_figures(opened: set[int]) -> None:
    """Close every pyplot figure made since ``opened`` (shown ones and any stray one)."""
    for num in set(plt.get_fignums()) - opened:
        plt.close(num)
