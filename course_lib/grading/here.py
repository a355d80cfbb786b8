"""Grade the notebook this kernel belongs to, from the notebook itself: ``grade_here()``.

Every exercise ends with a cell that calls it (:mod:`course_lib.grading.exercise_cells`). It runs
``python -m course_lib.grade <this notebook>`` with the kernel's own Python, so the learner's
notebook is graded as an instructor grades it: the file as last saved, in a fresh kernel, with
the course's own checks; the table is printed under the cell.

The kernel knows its notebook through the Jupyter server: the server starts every notebook's
kernel with ``JPY_SESSION_NAME`` = the notebook's path, and ipykernel copies it into the user
namespace as ``__session__``. A kernel started otherwise (the grader's own, ``jupyter execute``)
has neither, or inherits the grader's marker :data:`GRADING_ENV`; there the call prints one line
and grades nothing, so a graded notebook never grades itself again.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["GRADING_ENV", "grade_here", "notebook_path"]

GRADING_ENV = "COURSE_GRADING"  # set in the grader's environment by grade_here
TIMEOUT_S = 1800.0  # the whole grading run; the grader limits each cell on its own


def notebook_path() -> Path | None:
    """The notebook this kernel runs, from the Jupyter server; None when no server said."""
    name = os.environ.get("JPY_SESSION_NAME")
    if not name:
        try:
            from IPython import get_ipython

            shell = get_ipython()
        except ImportError:
            shell = None
        name = shell.user_ns.get("__session__") if shell is not None else None
    if not isinstance(name, str) or not name.endswith(".ipynb"):
        return None
    path = Path(name)
    # an absolute path, or one relative to the server's root; the kernel runs in the notebook's
    # folder, so its own file name is the last resort
    for candidate in (path, Path.cwd() / path, Path.cwd() / path.name):
        if candidate.is_file():
            return candidate.resolve()
    return None


def grade_here(*, solutions: str | Path | None = None, timeout: float = TIMEOUT_S) -> int | None:
    """Grade this notebook as saved, in a fresh kernel, and print the grade table.

    Returns the grade command's exit status (0: every task passes), or None when nothing was
    graded (no notebook known to this kernel, or called while the notebook is being graded).
    ``solutions``: the solutions folder (default: the grade command's, the course's own).
    """
    if os.environ.get(GRADING_ENV):
        print("(grade_here does nothing while the notebook is being graded)")
        return None
    path = notebook_path()
    if path is None:
        print(
            "grade_here: this kernel was not started by JupyterLab for a notebook; grade the file "
            "from a terminal instead: python -m course_lib.grade NOTEBOOK.ipynb"
        )
        return None
    saved = time.strftime("%H:%M:%S", time.localtime(path.stat().st_mtime))
    print(f"grading {path.name} as saved at {saved} (save first: Ctrl+S), in a fresh kernel...")
    sys.stdout.flush()
    env = {**os.environ, GRADING_ENV: "1"}
    env.pop("JPY_SESSION_NAME", None)
    command = [sys.executable, "-m", "course_lib.grade", str(path)]
    if solutions is not None:
        command += ["--solutions", str(Path(solutions).resolve())]
    process = subprocess.Popen(
        command,
        cwd=path.parent,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        encoding="utf-8",
    )
    try:
        out, _ = process.communicate(timeout=timeout)
    except BaseException:  # the ■ button, or the run took longer than ``timeout``
        _stop(process)
        raise
    print(out.rstrip("\n"))
    return process.returncode


def _stop(process: subprocess.Popen[Any]) -> None:
    """Stop the grader as Ctrl+C would (it shuts its kernel down), then for good."""
    process.send_signal(signal.SIGINT)
    try:
        process.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate(timeout=15)
