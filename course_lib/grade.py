"""``python -m course_lib.grade NOTEBOOK.ipynb``: score an exercise notebook per task.

See :mod:`course_lib.grading.grader` for how the solution is found and how outputs are compared.
"""

from __future__ import annotations

import sys

from course_lib.grading.grader import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
