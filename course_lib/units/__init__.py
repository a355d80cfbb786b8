"""One package per course unit: ``course_lib/units/uNN_topic/``.

Each unit package holds what belongs to that unit and nothing else:

- ``run.py``: the measured runs of the lecture, returning pandas DataFrames or plain data
  (no matplotlib, no ipywidgets);
- ``plots.py``: data -> matplotlib figure, one function per figure of the lecture;
- ``widgets.py``: the "Explore" widgets (a :class:`course_lib.viz.widgets.Explorer` each);
- ``checks.py``: the graded checks of the unit's exercises (standard library and
  ``course_lib.grading`` at module level only, so a check cell imports in milliseconds);
- ``cluster.py`` (optional): the unit's multi-rank runs as ``course_lib.cluster.Experiment`` objects.

Beside them a unit may hold section files that its module re-exports (``run_<section>.py``,
``checks_<section>.py``, ``plots_<section>.py``), private helpers (``_name.py``) and shipped data
(``data/``). ``tests/test_unit_contract.py`` checks every unit against this contract
(:func:`contract_violations`).

A notebook imports its unit under one name, the same in every notebook::

    from course_lib.units import u08_collectives as unit
    unit.run.measure_bytes(...); unit.plots.plot_bytes(...); unit.widgets.CollectiveExplorer()

The unit's ``__init__.py`` only makes ``unit.run``, ``unit.plots``, ``unit.widgets``,
``unit.checks`` and ``unit.cluster`` load on first use, so a check cell never pays for matplotlib or torch.
No unit imports another unit: what two units share lives in a mechanism layer
(``runtime``, ``measure``, ``models``, ``data``, ``techniques``, ``parallel``, ``viz``).
``tests/test_import_graph.py`` enforces these rules. A new unit starts from ``_template/``
(``make new-unit NN=05 TOPIC=cpu_offload``).
"""

from __future__ import annotations

import pathlib
from collections.abc import Callable
from types import ModuleType

from course_lib.runtime.interrupts import import_whole

#: the modules every unit package has (``_template/`` holds one of each)
REQUIRED_MODULES = ("run", "plots", "widgets", "checks")
#: the modules a unit package may add (``_template/`` holds one of each too)
OPTIONAL_MODULES = ("cluster",)
#: the modules a unit package may have, loaded on first attribute access
UNIT_MODULES = REQUIRED_MODULES + OPTIONAL_MODULES
#: section files a module splits into (``run_timing.py``), re-exported by that module
SECTION_PREFIXES = ("run_", "checks_", "plots_")
#: folders a unit may ship beside its modules
UNIT_FOLDERS = ("data", "__pycache__")
#: units that deliberately leave the contract, with the modules they do have and why
CONTRACT_EXCEPTIONS: dict[str, tuple[tuple[str, ...], str]] = {
    "u00_start_here": (
        ("checks",),
        "the orientation notebook: it shows the course's mechanisms (MemoryMeter, estimate, "
        "models, launch) directly and measures nothing of its own, so it has no run, plots or "
        "widgets; its one graded exercise has checks",
    ),
}


def contract_violations(unit_dir: pathlib.Path) -> list[str]:
    """What in ``unit_dir`` breaks the unit contract above (an empty list when nothing does)."""
    files = {p.stem for p in unit_dir.glob("*.py")} - {"__init__"}
    expected, _why = CONTRACT_EXCEPTIONS.get(unit_dir.name, (REQUIRED_MODULES, ""))
    problems = [f"{unit_dir.name}: missing {m}.py" for m in expected if m not in files]
    if not (unit_dir / "__init__.py").is_file():
        problems.append(f"{unit_dir.name}: missing __init__.py")
    for name in sorted(files - set(UNIT_MODULES)):
        if not name.startswith(("_", *SECTION_PREFIXES)):
            problems.append(f"{unit_dir.name}: unknown module {name}.py")
    for sub in sorted(p.name for p in unit_dir.iterdir() if p.is_dir()):
        if sub not in UNIT_FOLDERS:
            problems.append(f"{unit_dir.name}: unknown folder {sub}/")
    return problems


def unit_getattr(package: str) -> Callable[[str], ModuleType]:
    """A PEP 562 ``__getattr__`` for a unit package: ``unit.run`` imports ``package.run``."""

    def __getattr__(name: str) -> ModuleType:
        if name in UNIT_MODULES:
            return import_whole(f"{package}.{name}")  # torch too: never half
        raise AttributeError(
            f"module {package!r} has no attribute {name!r}; a unit has "
            f"{', '.join(REQUIRED_MODULES)} and may have {', '.join(OPTIONAL_MODULES)}"
        )

    return __getattr__
