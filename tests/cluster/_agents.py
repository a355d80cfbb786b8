"""The tests' torchrun agents: course_lib.cluster.local, with check=False so a test can look
at a failed agent's report."""

from __future__ import annotations

import pathlib

from course_lib.cluster.local import run_agents, torchrun_here
from course_lib.cluster.local import torchrun_command as torchrun

__all__ = ["run_agents", "torchrun", "two_nodes"]


def two_nodes(script: str, cwd, *, nproc_per_node: int = 2, timeout: float = 90.0):
    """Two agents (node ranks 0 and 1) on this host; node 0 hosts the rendezvous store."""
    return torchrun_here(
        pathlib.Path(cwd) / script,
        nnodes=2,
        nproc_per_node=nproc_per_node,
        timeout=timeout,
        check=False,
    )
