"""Unit NN's measured runs (notebooks/NN_TOPIC.ipynb).

What goes here: the functions the lecture calls to *measure* something, each returning a pandas
DataFrame or plain data (dicts, lists, numbers) -- never a figure. They build on the mechanism
layers (``course_lib.measure``, ``runtime``, ``techniques``, ``parallel``, ``models``, ``data``)
and put predictions from ``course_lib.measure.estimate`` beside the measurements, with the
residual. Multi-rank runs go through ``course_lib.launch``; the rank function lives here too.
Check arguments with ``course_lib.validate`` before anything runs.
No matplotlib, no ipywidgets, no import of another unit (tests/test_import_graph.py).
"""

from __future__ import annotations

__all__: list[str] = []
