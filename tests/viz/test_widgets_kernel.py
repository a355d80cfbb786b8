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
    env["PYTHONPATH"] = os.pathsep.join([str(Path(course_lib.__file__).parents[1]),
                                         env.get("PYTHONPATH", "")])
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
        if (msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "status"
                and msg["content"]["execution_state"] == "idle"):
            return out


def _cell(kc, code: str) -> list[dict]:
    """Run a cell; its outputs (nothing else)."""
    msgs = _messages(kc, kc.execute(code))
    return [m for m in msgs if m["msg_type"] in OUTPUTS]


def test_first_click_shows_everything_inside_the_output_widget(kernel):
    [printed] = _cell(kernel, SETUP)
    button, output = printed["content"]["text"].split()
    click = kernel.session.msg("comm_msg", {"comm_id": button, "data": {
        "method": "custom", "content": {"event": "click"}}})
    kernel.shell_channel.send(click)
    capturing, inside, outside = "", [], []
    for msg in _messages(kernel, click["header"]["msg_id"]):
        if msg["msg_type"] == "comm_msg" and msg["content"]["comm_id"] == output:
            capturing = msg["content"]["data"].get("state", {}).get("msg_id", capturing)
        elif msg["msg_type"] in OUTPUTS:
            here = capturing == msg["parent_header"]["msg_id"]
            (inside if here else outside).append(msg["content"])
    assert outside == []
    shown = [c["data"]["text/plain"] for c in inside if "data" in c]
    assert len(shown) == 2 and shown[0].startswith("<Figure") and shown[1] == "'a table'"
    after = _cell(kernel, "print(plt.get_fignums(), plt.isinteractive(), ex.result)")
    assert [m["content"].get("text") for m in after] == ["[] True 3\n"]  # and no figure shown again
