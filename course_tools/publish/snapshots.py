"""What a page without a kernel shows of an "Explore" widget: its snapshot, not its controls.

A stored widget needs a kernel to do anything: on a static page or slide its controls are dead and
its output area is empty. Shown in a lecture, an explorer stores after the widget a snapshot of
its run at the default settings (:meth:`course_lib.viz.widgets.Explorer.snapshot`): an HTML output
marked ``course-snapshot`` (a line saying that the live version runs in JupyterLab, and the
widget's status line), then the pictures the widget showed. :func:`static` gives the pages and
slides that snapshot in place of the widget.
"""

from __future__ import annotations

import copy

#: course_lib.viz.widgets.SNAPSHOT_CLASS (not imported: it would load ipywidgets and matplotlib)
SNAPSHOT_CLASS = "course-snapshot"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def is_snapshot(out) -> bool:
    """Whether a stored output is the first output of an explorer's snapshot."""
    html = out.get("data", {}).get("text/html", "")
    return f'class="{SNAPSHOT_CLASS}"' in ("".join(html) if isinstance(html, list) else html)


def static(nb):
    """A copy of ``nb`` in which each widget followed by a snapshot in its cell is left out: a
    static page shows the snapshot (the widget's default run and where the live one runs)."""
    nb = copy.deepcopy(nb)
    for cell in nb.cells:
        outputs = cell.get("outputs", [])
        if cell.cell_type != "code" or not any(is_snapshot(out) for out in outputs):
            continue
        kept, pending = [], []  # widget views wait until we know whether a snapshot follows
        for out in outputs:
            if WIDGET_VIEW in out.get("data", {}):
                pending.append(out)
                continue
            if not is_snapshot(out):
                kept += pending
            pending = []
            kept.append(out)
        cell.outputs = kept + pending
    return nb
