"""An Explorer clicked in a live kernel, the way JupyterLab sends the click (a comm message).

Everything the run shows must land in the explorer's Output widget (an output sent while the
widget is not capturing goes to JupyterLab's log console), no figure may stay open for the inline
backend to show again at the end of the next cell, and matplotlib's interactive mode must be as
the inline backend left it. The first click is the case that matters: pyplot loads its backend
inside the click's callback.
"""

from __future__ import annotations

import os
import queue
from pathlib import Path

import pytest

import course_lib

pytest.importorskip("ipykernel")
manager = pytest.importorskip("jupyter_client.manager")

SETUP = """
import matplotlib.pyplot as plt
from course_lib.viz.widgets import Explorer

class Line(Explorer):
    def compute(self):
        return 3

    def show(self, result):
        fig, ax = plt.subplots()
        ax.plot(range(result))
        return [fig, "a table"]

ex = Line()
print(ex.run_button.model_id, ex.output.model_id)
"""

OUTPUTS = ("display_data", "stream", "error", "execute_result", "clear_output")


@pytest.fixture(scope="module")
def kernel():
    env = {k: v for k, v in os.environ.items() if k != "MPLBACKEND"}  # the kernel's own: inline
    env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(course_lib.__file__).parents[1]), env.get("PYTHONPATH", "")]
    )
    km, kc = manager.start_new_kernel(kernel_name="python3", env=env)
    yield kc
    kc.stop_channels()
    km.shutdown_kernel(now=True)


def _messages(kc, msg_id: str) -> list[dict]:
    """iopub messages until the kernel is idle again after the request ``msg_id``."""
    out = []
    while True:
        try:
            msg = kc.get_iopub_msg(timeout=60)
        except queue.Empty:
            pytest.fail("the kernel did not answer within 60 s")
        out.append(msg)
        if (
            msg["parent_header"].get("msg_id") == msg_id
            and msg["msg_type"] == "status"
            and msg["content"]["execution_state"] == "idle"
        ):
            return out


def _cell(kc, code: str) -> list[dict]:
    """Run a cell; its outputs (nothing else)."""
    msgs = _messages(kc, kc.execute(code))
    return [m for m in msgs if m["msg_type"] in OUTPUTS]


def _printed(outputs: list[dict]) -> str:
    """What a cell printed: the kernel may send one print in several stream messages."""
    assert all(m["msg_type"] == "stream" for m in outputs), [m["msg_type"] for m in outputs]
    return "".join(m["content"]["text"] for m in outputs)


def test_first_click_shows_everything_inside_the_output_widget(kernel):
    button, output = _printed(_cell(kernel, SETUP)).split()
    states, outside = _click(kernel, button, output)
    assert outside == []  # no output message at all: nothing JupyterLab could misroute
    [shown] = [s["outputs"] for s in states if "outputs" in s]  # one update: old replaced at once
    assert [o["data"]["text/plain"][:7] for o in shown] == ["<Figure", "'a table'"[:7]]
    assert shown[0]["data"]["image/png"]  # the figure, rendered as the inline backend would
    after = _cell(kernel, "print(plt.get_fignums(), plt.isinteractive(), ex.result)")
    assert _printed(after) == "[] True 3\n"  # and no figure shown again


UNIT01 = """%matplotlib inline
from course_lib.units import u01_backprop_memory as unit
ex = unit.widgets.StepMemoryExplorer()
ex.width.value = 32
ex.batch.value = 2
print(ex.run_button.model_id, ex.output.model_id)
"""


def _click(kc, button: str, output: str) -> tuple[list[dict], list[dict]]:
    """Click ``button`` as JupyterLab does. Returns the state updates of the Output widget
    ``output`` and every output message the click caused: such a message reaches the widget only
    if JupyterLab has already seen the widget's capture switched on (often not on the first
    click after a kernel start: then it goes to the Log Console), so an Explorer sends none."""
    click = kc.session.msg(
        "comm_msg", {"comm_id": button, "data": {"method": "custom", "content": {"event": "click"}}}
    )
    kc.shell_channel.send(click)
    states, outside = [], []
    for msg in _messages(kc, click["header"]["msg_id"]):
        if msg["msg_type"] == "comm_msg" and msg["content"]["comm_id"] == output:
            states.append(msg["content"]["data"].get("state", {}))
        elif msg["msg_type"] in OUTPUTS:
            outside.append(msg["content"])
    return states, outside


def test_unit01_explorer_clicked_twice_after_a_fresh_kernel_shows_nothing_outside():
    """Unit 01's StepMemoryExplorer, as a learner meets it: a fresh kernel, the unit imported
    lazily, Run clicked twice. Every figure lands in its Output; none is left for the inline
    backend to show at the end of the next cell."""
    env = {k: v for k, v in os.environ.items() if k != "MPLBACKEND"}
    env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(course_lib.__file__).parents[1]), env.get("PYTHONPATH", "")]
    )
    km, kc = manager.start_new_kernel(kernel_name="python3", env=env)
    try:
        button, output = _printed(_cell(kc, UNIT01)).split()
        for batch in (2, 4):  # a new batch: new pictures, so the output state changes
            _cell(kc, f"ex.batch.value = {batch}")
            states, outside = _click(kc, button, output)
            assert outside == []
            [shown] = [s["outputs"] for s in states if "outputs" in s]
            assert len(shown) == 2 and "text/html" in shown[0]["data"]  # the table
            assert "image/png" in shown[1]["data"]  # the timeline
        after = _cell(kc, "import matplotlib.pyplot as plt; print(plt.get_fignums())")
        assert [m["content"].get("text") for m in after] == ["[]\n"]
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
