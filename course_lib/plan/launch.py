"""From a plan's row to what starts it: its :class:`~course_lib.plan.Layout` (``plan.layout_of``,
which ``parallel.mesh.Mesh``, ``plan.run_layout.run_layout`` and the virtual cluster take) and the
torchrun command (``plan.launch_command``)."""

from __future__ import annotations

from typing import Any

from course_lib import validate as _v
from course_lib.plan.specs import Layout
from course_lib.runtime.commands import launch_command as torchrun_command
from course_lib.runtime.commands import slurm_script

#: the layout columns of a plan row passed to the training script, as --name value (cp and ep
#: are added when the row uses them)
LAYOUT_ARGS = ("dp", "tp", "pp", "zero", "recompute", "micro_batch", "v")
_FIVE_D = ("cp", "ep")


def launch_command(
    result: Any,
    rank: int = 1,
    *,
    script: str = "train.py",
    rdzv_endpoint: str = "$HEAD_NODE:29500",
    slurm: bool = False,
    args: tuple[str, ...] = LAYOUT_ARGS,
) -> str:
    """The torchrun command (or, with ``slurm=True``, the sbatch file) that starts the layout
    ranked ``rank`` in ``result`` (what :func:`course_lib.plan.plan` returned) on its cluster:
    ``--nproc-per-node`` = the cluster's GPUs per node, ``--nnodes`` = dp x tp x pp x cp / that,
    and the layout passed to ``script`` as ``--dp .. --tp .. --pp .. --zero .. --recompute ..
    --micro-batch .. --v ..`` (the names of the plan's columns; ``args`` picks which; ``--cp`` and
    ``--ep`` follow when the row uses them and ``args`` is the default). ``script``
    is your training script, or one exported by ``course_lib.cluster`` (``u14.run_3d`` takes
    ``args=("dp", "tp", "pp")``)."""
    inputs = getattr(result, "attrs", {}).get("inputs")
    if inputs is None or "cluster" not in inputs:
        raise TypeError(
            f"result = {type(result).__name__}: expected the DataFrame plan.plan() "
            "returned (its attrs hold the cluster)"
        )
    if len(result) == 0:
        raise ValueError("result = an empty plan: expected a layout that fits (nothing to launch)")
    rank = _v.count("rank", rank, minimum=1, maximum=len(result))
    row = result[result["rank"] == rank].iloc[0]
    cp = int(row["cp"]) if "cp" in row.index else 1
    gpus = int(row["dp"] * row["tp"] * row["pp"]) * cp
    per_node = inputs["cluster"].gpus_per_node
    if gpus <= per_node:
        nodes, nproc = 1, gpus
    elif gpus % per_node:
        raise ValueError(f"rank = {rank}: its {gpus} GPUs do not fill whole nodes of {per_node}")
    else:
        nodes, nproc = gpus // per_node, per_node
    chosen = _v.choices("args", list(args), LAYOUT_ARGS + _FIVE_D)
    if tuple(args) == LAYOUT_ARGS:
        chosen += [k for k in _FIVE_D if k in row.index and row[k] > 1]
    values = {k: (row[k].item() if hasattr(row[k], "item") else row[k]) for k in chosen}
    if slurm:
        return slurm_script(script, nodes=nodes, gpus_per_node=nproc, args=values)
    if nodes == 1:
        return torchrun_command(script, nproc_per_node=nproc, args=values)
    return torchrun_command(
        script, nproc_per_node=nproc, nnodes=nodes, rdzv_endpoint=rdzv_endpoint, args=values
    )


def layout_of(result: Any, rank: int = 1) -> Layout:
    """The Layout of the plan row ranked ``rank`` in ``result`` (what ``plan.plan`` returned)."""
    if not hasattr(result, "columns") or "rank" not in result.columns:
        raise TypeError(
            f"result = {_v.describe(result)}: expected the DataFrame plan.plan() returned"
        )
    if len(result) == 0:
        raise ValueError("result = an empty plan: expected a layout that fits")
    rank = _v.count("rank", rank, minimum=1, maximum=len(result))
    row = result[result["rank"] == rank].iloc[0]
    get = {k: int(row[k]) for k in ("dp", "tp", "pp", "zero", "micro_batch", "v")}
    return Layout(
        get["dp"],
        get["tp"],
        get["pp"],
        get["zero"],
        str(row["recompute"]),  # type: ignore[arg-type]  # a Recompute, as the search wrote it
        get["micro_batch"],
        get["v"],
        cp=int(row["cp"]) if "cp" in row.index else 1,
        ep=int(row["ep"]) if "ep" in row.index else 1,
        etp=int(row["etp"]) if "etp" in row.index else 0,
    )
