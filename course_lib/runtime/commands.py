"""The commands that start N ranks on a cluster: the torchrun line for one node or several
(:func:`launch_command`) and an ``sbatch`` file around it (:func:`slurm_script`). Plain text,
nothing is run. Used by ``course_lib.cluster`` (a unit's exported experiment) and by
``course_lib.plan.launch_command`` (a planned layout). Introduced in
notebooks/14_planning_a_run.ipynb.
"""

from __future__ import annotations

import os
import shlex
from typing import Any

from course_lib import validate

__all__ = ["DEFAULT_PORT", "launch_command", "slurm_script"]

DEFAULT_PORT = 29500


def launch_command(
    script: str | os.PathLike[str],
    *,
    nproc_per_node: int,
    nnodes: int = 1,
    rdzv_endpoint: str | None = None,
    rdzv_id: str = "$JOB_ID",
    args: dict[str, Any] | None = None,
) -> str:
    """The torchrun command that runs ``script`` on ``nnodes`` x ``nproc_per_node`` ranks.

    One node and no ``rdzv_endpoint``: ``--standalone`` (torchrun picks a free port on this
    host). Otherwise every node runs the same command; the c10d rendezvous at ``rdzv_endpoint``
    (default ``$HEAD_NODE:29500``: a host every node can reach, the job's first node) groups
    them, ``rdzv_id`` keeps two jobs apart. ``args``:
    settings to pass to the script (``{"dp": 2}`` -> ``--dp 2``).
    """
    nproc = validate.count("nproc_per_node", nproc_per_node, minimum=1)
    nodes = validate.count("nnodes", nnodes, minimum=1)
    tail = [str(script)]
    for key, value in (args or {}).items():
        shown = ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
        tail += ["--" + key.replace("_", "-"), shown]
    tail_text = " ".join(shlex.quote(t) for t in tail)
    if nodes == 1 and rdzv_endpoint is None:
        return f"torchrun --standalone --nproc-per-node {nproc} {tail_text}"
    # $HEAD_NODE / $JOB_ID stay unquoted so the shell (or srun) expands them on each node
    return (
        f"torchrun --nnodes {nodes} --nproc-per-node {nproc} --rdzv-backend c10d "
        f"--rdzv-endpoint {rdzv_endpoint or '$HEAD_NODE:' + str(DEFAULT_PORT)} --rdzv-id {rdzv_id} {tail_text}"
    )


def slurm_script(
    script: str | os.PathLike[str],
    *,
    nodes: int,
    gpus_per_node: int,
    time: str = "00:30:00",
    job_name: str = "course-run",
    partition: str | None = None,
    port: int = DEFAULT_PORT,
    args: dict[str, Any] | None = None,
    venv: str = ".venv",
) -> str:
    """An ``sbatch`` file that runs ``script`` with torchrun on ``nodes`` x ``gpus_per_node``
    ranks: one task per node (``srun`` starts one torchrun agent on each), the first node of the
    allocation as the rendezvous host, the job id as the rendezvous id."""
    nodes = validate.count("nodes", nodes, minimum=1)
    gpus = validate.count("gpus_per_node", gpus_per_node, minimum=1)
    port = validate.count("port", port, minimum=1, maximum=65535)
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={job_name}",
        f"#SBATCH --nodes={nodes}",
        "#SBATCH --ntasks-per-node=1          # one torchrun agent per node; it starts the ranks",
        f"#SBATCH --gpus-per-node={gpus}",
        f"#SBATCH --cpus-per-task={max(2, 4 * gpus)}",
        f"#SBATCH --time={time}",
        "#SBATCH --output=%x-%j.out",
    ]
    if partition:
        lines.append(f"#SBATCH --partition={partition}")
    command = launch_command(
        script,
        nproc_per_node=gpus,
        nnodes=nodes,
        rdzv_endpoint=f"$HEAD_NODE:{port}",
        rdzv_id="$SLURM_JOB_ID",
        args=args,
    )
    lines += [
        "",
        "set -euo pipefail",
        f"source {venv}/bin/activate             # the course's environment, on every node",
        'HEAD_NODE=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        "export HEAD_NODE",
        "# a failed rank: torchrun prints its traceback (the root cause) to the job's output",
        "# NCCL on GPUs is chosen by course_lib as launch chooses it (one GPU per rank);",
        "# export NCCL_DEBUG=INFO to see the links it uses.",
        "",
        f"srun {command}",
        "",
    ]
    return "\n".join(lines)
