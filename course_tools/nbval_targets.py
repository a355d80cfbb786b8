"""pytest plugin: nbval compares every cell tagged ``NBVAL_CHECK_OUTPUT``, and an exercise's check
cells against the solution's outputs, not against the target text they show.

1. nbval knows the metadata tag only as ``nbval-check-output`` (or a ``# NBVAL_CHECK_OUTPUT``
   comment in the source); the course tags its deterministic cells ``NBVAL_CHECK_OUTPUT``, which
   stock nbval ignores, so under ``--nbval-lax`` it compared no output at all. Here such a cell's
   output is compared (unless it is also tagged ``nbval-ignore-output``).
2. An exercise's check cell is generated with no execution count and one output that reads
   ``expected once your answer is right: ✓ task 1: ...`` (see :mod:`course_lib.grading.exercises`),
   so a learner never mistakes it for a pass; the solution's real outputs sit in the cell's
   metadata, ``course.expected_outputs``. Stock nbval would refuse such a cell ("Unrun reference
   cell has outputs"); here those outputs become its reference (with a placeholder execution
   count, which nbval never compares), so ``pytest --nbval-lax exercises/03_precision.ipynb`` runs
   the learner's code and compares each check's fresh output with the solution's, whatever the
   file shows (the target, or the learner's own last run).

The repository's ``conftest.py`` loads this plugin; elsewhere pass
``-p course_tools.nbval_targets``.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

from course_lib.grading.exercises import expected_outputs
from course_lib.grading.notebooks import CHECK_TAG

if TYPE_CHECKING:
    import pytest


def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    try:
        import nbformat
        from nbval.plugin import IPyNbCell
    except ImportError:  # no nbval: no notebook items to adjust
        return
    for item in items:
        if not isinstance(item, IPyNbCell):
            continue
        tags = item.cell.get("metadata", {}).get("tags", [])
        if CHECK_TAG in tags and "nbval-ignore-output" not in tags:
            # nbval reads a metadata tag only as "nbval-check-output" (or a "# NBVAL_CHECK_OUTPUT"
            # comment in the source); the course tags its deterministic cells NBVAL_CHECK_OUTPUT
            item.options["check"] = True
        expected = expected_outputs(item.cell)
        if expected is None:
            continue
        cell = copy.deepcopy(item.cell)
        cell.outputs = [nbformat.from_dict(copy.deepcopy(o)) for o in expected]
        if cell.get("execution_count") is None:
            cell.execution_count = 0  # nbval compares only cells it sees as run; never compared
        item.cell = cell
