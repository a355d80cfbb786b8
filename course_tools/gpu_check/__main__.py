"""``python -m course_tools.gpu_check``: see :mod:`course_tools.gpu_check.cli`.

Importing the checks here at module level is deliberate: ``course_lib.launch`` imports the
caller's main module once into its forkserver, so every check's rank starts with them loaded.
"""

from __future__ import annotations

import sys

from course_tools.gpu_check import catalog  # noqa: F401 - preloads the checks (see above)
from course_tools.gpu_check.cli import main

if __name__ == "__main__":
    sys.exit(main())
