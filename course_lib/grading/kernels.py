"""The kernel a notebook runs in, for the grader and for re-executing a notebook.

:func:`make_client` is the nbclient set-up (a fresh kernel whose working directory is the
notebook's folder, no timing metadata, immediate shutdown); :func:`kernel_env` its environment,
with this checkout's ``course_lib`` first on PYTHONPATH. The grader (``python -m course_lib.grade``)
and its zygotes use both; so does ``python -m course_tools.execute`` (``make notebooks``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

__all__ = ["KERNEL_ARGS", "kernel_env", "make_client"]

# the kernel's own log (e.g. ipykernel's "running over TCP without encryption" warning on every
# start) is infrastructure noise on the command's stderr; cell output is unaffected
KERNEL_ARGS = ["--IPKernelApp.log_level=ERROR"]


def kernel_env() -> dict[str, str]:
    """Environment for a kernel: this process's, with the directory holding ``course_lib`` first
    on PYTHONPATH so the kernel grades and measures with the same package as the caller."""
    import course_lib

    root = str(Path(course_lib.__file__).resolve().parent.parent)
    env = dict(os.environ)
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != root]
    env["PYTHONPATH"] = os.pathsep.join([root, *parts])
    env.pop("MPLBACKEND", None)  # let ipykernel pick its inline backend so figures are stored
    env.pop("JPY_PARENT_PID", None)
    return env


def make_client(
    nb: Any, path: Path, *, timeout: float, kernel_name: str, allow_errors: bool, log: Any = None
) -> Any:
    """The nbclient set-up shared by the grader and ``course_tools.execute``: a fresh kernel
    whose working directory is the notebook's folder, no timing metadata, immediate shutdown."""
    from nbclient import NotebookClient

    kwargs = {"log": log} if log is not None else {}
    return NotebookClient(
        nb,
        timeout=timeout,
        kernel_name=kernel_name,
        allow_errors=allow_errors,
        record_timing=False,
        # True: with False, nbclient raises KeyError when a cell writes into an
        # ipywidgets.Output. The saved widget state is dropped afterwards (not deterministic).
        store_widget_state=True,
        shutdown_kernel="immediate",
        extra_arguments=list(KERNEL_ARGS),
        resources={"metadata": {"path": str(Path(path).resolve().parent)}},
        **kwargs,
    )
