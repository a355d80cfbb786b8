"""From the notebook to a cluster: a unit's multi-rank experiment as a torchrun-ready script.

::

    python -m course_lib.cluster list
    python -m course_lib.cluster export u09.bytes --bucket-cap-mb 25 > ddp.py
    torchrun --standalone --nproc-per-node 4 ddp.py          # rank 0 writes ddp_results.json
    python -m course_lib.cluster slurm ddp.py --nodes 2 --gpus-per-node 8 > ddp.sbatch

and in a notebook ``cluster.export("u09.bytes", "ddp.py", bucket_cap_mb=25)``, then
``cluster.load("ddp_results.json").value``: the same DataFrame ``unit.run.bytes_per_step`` gives,
drawn with the unit's own plots. ``cluster.run("u09.bytes", 4)`` runs the experiment here with
``course_lib.launch``; the tests check that torchrun (one agent, or two agents meeting at a c10d
rendezvous as two nodes would) gives the same result.

Each unit declares what it exports in ``units/uNN_topic/cluster.py`` (``EXPERIMENTS``).
"""

from __future__ import annotations

from course_lib.cluster.experiment import Experiment, experiments, get
from course_lib.cluster.local import torchrun_here
from course_lib.cluster.results import differences
from course_lib.cluster.runner import ClusterResult, load, main, run
from course_lib.cluster.script import export, render
from course_lib.runtime.commands import launch_command, slurm_script

__all__ = [
    "ClusterResult",
    "Experiment",
    "differences",
    "experiments",
    "export",
    "get",
    "launch_command",
    "load",
    "main",
    "render",
    "run",
    "slurm_script",
    "torchrun_here",
]
