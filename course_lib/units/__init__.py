"""One package per course unit: ``course_lib/units/uNN_topic/``.

Each unit package holds what belongs to that unit and nothing else:

- ``run.py``: the measured runs of the lecture, returning pandas DataFrames or plain data
  (no matplotlib, no ipywidgets);
- ``plots.py``: data -> matplotlib figure, one function per figure of the lecture;
- ``widgets.py``: the "Explore" widgets (a :class:`course_lib.viz.widgets.Explorer` each);
- ``checks.py``: the graded checks of the unit's exercises (standard library and
  ``course_lib.grading`` at module level only, so a check cell imports in milliseconds).

A notebook imports its unit under one name, the same in every notebook::

    from course_lib.units import u08_collectives as unit
    unit.run.measure_bytes(...); unit.plots.plot_bytes(...); unit.widgets.CollectiveExplorer()

The unit's ``__init__.py`` only makes ``unit.run``, ``unit.plots``, ``unit.widgets`` and
``unit.checks`` load on first use, so a check cell never pays for matplotlib or torch.
No unit imports another unit: what two units share lives in a mechanism layer
(``runtime``, ``measure``, ``models``, ``data``, ``techniques``, ``parallel``, ``viz``).
``tests/test_import_graph.py`` enforces these rules. A new unit starts from ``_template/``
(``make new-unit NN=05 TOPIC=cpu_offload``).
"""

from __future__ import annotations

import importlib

#: the modules a unit package may have, loaded on first attribute access
UNIT_MODULES = ("run", "plots", "widgets", "checks")


def unit_getattr(package: str):
    """A PEP 562 ``__getattr__`` for a unit package: ``unit.run`` imports ``package.run``."""

    def __getattr__(name: str):
        if name in UNIT_MODULES:
            return importlib.import_module(f"{package}.{name}")
        raise AttributeError(
            f"module {package!r} has no attribute {name!r}; a unit has {', '.join(UNIT_MODULES)}"
        )

    return __getattr__
