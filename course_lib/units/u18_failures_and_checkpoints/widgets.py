"""Unit 18's "Explore" widget (notebooks/18_failures_and_checkpoints.ipynb).

What goes here: a subclass of ``course_lib.viz.widgets.Explorer`` with only its controls, its
``compute()`` (one call into ``run.py``) and its ``show()`` (one call into ``plots.py``).
Nothing runs until Run is pressed. Test it by driving it from Python (set values, click Run).
"""

from __future__ import annotations

__all__: list[str] = []
