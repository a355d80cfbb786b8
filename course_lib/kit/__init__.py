"""What every unit's measured runs share: typed rows and the frame built from them.

A unit's rank worker returns a frozen dataclass (its *row*); the unit's ``run`` builds its
DataFrame with :func:`frame`, so the frame's columns are the row's fields, in order. A unit's
``plots`` and ``checks`` declare the columns they read in a module-level ``READS`` mapping
(row type -> column names); tests/test_unit_contract.py checks that each is a field of its row.
"""

from course_lib.kit.rows import columns, frame, reads_violations

__all__ = ["columns", "frame", "reads_violations"]
