"""Unit NN's experiments that run under torchrun (``python -m course_lib.cluster list``).

Optional: only a unit with multi-rank runs has this file (``make new-unit`` does not copy it).
What goes here: one ``course_lib.cluster.Experiment`` per multi-rank run of ``run.py``, each a
``fn(world_size, **settings)`` wrapper that imports ``run`` inside and calls one of its functions.
``course_lib.cluster`` finds ``EXPERIMENTS`` by walking the units folder; tests live in
``tests/cluster``.
"""

from __future__ import annotations

from course_lib.cluster import Experiment

EXPERIMENTS: list[Experiment] = []
