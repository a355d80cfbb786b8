"""What every unit's measured runs share: typed rows and the frame built from them.

A unit's rank worker returns a frozen dataclass (its *row*); the unit's ``run`` builds its
DataFrame with :func:`frame`, so the frame's columns are the row's fields, in order. A unit's
``plots`` and ``checks`` declare the columns they read in a module-level ``READS`` mapping
(row type -> column names); tests/test_unit_contract.py checks that each is a field of its row.

- :func:`sweep` runs a worker over configurations (:func:`grid`), in this process or on ranks,
  and frames the rows it returns; :func:`one_thread` keeps tiny timed matmuls on one thread.
- :func:`bars_beside` and :func:`line_beside` draw the estimate beside the measurement (they
  live in :mod:`course_lib.viz.compare` and load on first use: a rank or a check that imports
  the kit never imports matplotlib).
- :func:`check_table` runs a graded check over a table of answers and the lines it must say.
"""

from typing import TYPE_CHECKING, Any

from course_lib.kit.check_table import check_table
from course_lib.kit.rows import column, columns, frame, reads_violations
from course_lib.kit.sweep import grid, one_thread, rows_of, sweep

if TYPE_CHECKING:
    from course_lib.viz.compare import PREDICTED_BAR, bars_beside, line_beside

__all__ = [
    "PREDICTED_BAR",
    "bars_beside",
    "check_table",
    "column",
    "columns",
    "frame",
    "grid",
    "line_beside",
    "one_thread",
    "reads_violations",
    "rows_of",
    "sweep",
]

#: the names that load :mod:`course_lib.viz.compare` (matplotlib) when first asked for
_DRAWING = ("PREDICTED_BAR", "bars_beside", "line_beside")


def __getattr__(name: str) -> Any:
    if name in _DRAWING:
        from course_lib.viz import compare

        return getattr(compare, name)
    raise AttributeError(f"module 'course_lib.kit' has no attribute {name!r}")
