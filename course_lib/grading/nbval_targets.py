"""pytest plugin: nbval compares an exercise's check cells with the targets the generator stored.

An exercise's check cell (tag ``NBVAL_CHECK_OUTPUT``) is generated with no execution count and one
output that reads ``expected once your answer is right: ✓ task 1: ...`` (see
:mod:`course_lib.grading.exercises`), so a learner never mistakes it for a pass. The solution's
real outputs sit in the cell's metadata, ``course.expected_outputs``. Stock nbval would refuse such
a cell ("Unrun reference cell has outputs"); this plugin, after collection, gives each nbval cell
that carries ``course.expected_outputs`` those outputs as its reference (and a placeholder
execution count, which nbval never compares), so

    pytest --nbval-lax exercises/03_precision.ipynb

runs the learner's code and compares each check cell's fresh output with the solution's, whatever
the file shows (the target, or the learner's own last run). Lectures and solutions carry no such
metadata and are validated exactly as before. The repository's ``conftest.py`` loads this plugin;
elsewhere pass ``-p course_lib.grading.nbval_targets``.
"""

from __future__ import annotations

import copy

from course_lib.grading.exercises import expected_outputs


def pytest_collection_modifyitems(session, config, items):
    try:
        import nbformat
        from nbval.plugin import IPyNbCell
    except ImportError:  # no nbval: no notebook items to adjust
        return
    for item in items:
        if not isinstance(item, IPyNbCell):
            continue
        expected = expected_outputs(item.cell)
        if expected is None:
            continue
        # nbval reads the metadata tag as "nbval-check-output" only; the course's check cells
        # carry "NBVAL_CHECK_OUTPUT", so say explicitly that this cell's output is compared
        item.options["check"] = True
        cell = copy.deepcopy(item.cell)
        cell.outputs = [nbformat.from_dict(copy.deepcopy(o)) for o in expected]
        if cell.get("execution_count") is None:
            cell.execution_count = 0  # nbval compares only cells it sees as run; never compared
        item.cell = cell
