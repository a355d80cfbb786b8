"""Unit 18's graded checks (solutions/18_failures_and_checkpoints.ipynb).

What goes here: one ``check_<task>(learner_answer, task=N)`` per graded task. A check runs the
learner's code (``course_lib.grading.run_learner``), compares it with an invariant that does not
depend on the hardware (parity with a reference, exact bytes, a ratio), and prints exactly one
line through ``course_lib.grading.passed`` ("✓ task N: ...") or raises through
``course_lib.grading.fail`` ("✗ task N: ..."). The course's own reference for the task must be
out of the learner's reach during the check, so importing the answer scores nothing.
At module level import only the standard library and ``course_lib.grading``: a check cell must
import in milliseconds. Import torch and the course's mechanisms inside the check functions.
"""

from __future__ import annotations

__all__: list[str] = []
