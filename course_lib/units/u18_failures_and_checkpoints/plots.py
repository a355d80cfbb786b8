"""Unit 18's figures (notebooks/18_failures_and_checkpoints.ipynb).

What goes here: one function per figure of the lecture, taking what ``run.py`` returned and
returning a matplotlib Figure, drawn inside ``course_lib.viz.plots.style()`` so every figure
shares one readable style. Check the input frame with ``course_lib.viz.plots.require_columns``.
Measured values are drawn beside predicted ones. No computation that belongs in ``run.py``.
"""

from __future__ import annotations

__all__: list[str] = []
