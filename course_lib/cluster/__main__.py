"""``python -m course_lib.cluster list | export | command | slurm``: see course_lib/cluster."""

from __future__ import annotations

import argparse
import os
import sys

from course_lib.cluster.experiment import experiments, get
from course_lib.cluster.runner import OneLineParser
from course_lib.cluster.script import render
from course_lib.runtime.commands import launch_command, slurm_script


def _settings(exp, extra: list[str]) -> dict:
    """``--bucket-cap-mb 25`` -> {"bucket_cap_mb": "25"} (typed later by the experiment)."""
    out: dict = {}
    valid = ", ".join("--" + k.replace("_", "-") for k in exp.defaults) or "none"
    i = 0
    while i < len(extra):
        flag = extra[i]
        if not flag.startswith("--"):
            raise ValueError(
                f"{flag}: expected a setting (--name value); settings of {exp.name}: {valid}"
            )
        key, eq, value = flag[2:].partition("=")
        if not eq:
            if i + 1 >= len(extra):
                raise ValueError(f"{flag}: expected a value after it")
            value = extra[i + 1]
            i += 1
        out[key.replace("-", "_")] = value
        i += 1
    return out


def _redirected_name() -> str:
    """The name of the .py file standard output goes to (``... > ddp.py``), if it is one."""
    try:
        target = os.readlink("/proc/self/fd/1")
    except OSError:
        return "experiment.py"
    return os.path.basename(target) if target.endswith(".py") else "experiment.py"


def _parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="python -m course_lib.cluster",
        description="Run the course's multi-rank experiments under "
        "torchrun, on one machine or a cluster.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="the experiments that export, with their settings")
    ex = sub.add_parser("export", help="print a torchrun-ready script (settings: --name value)")
    ex.add_argument("experiment", help="e.g. u09.bytes, or a unit (u09: its first experiment)")
    ex.add_argument(
        "--script-name",
        default=None,
        help="the file name you will save it as, for its instructions (default: the "
        "file standard output is redirected to, else experiment.py)",
    )
    ex.add_argument("--out", help="the results file its rank 0 writes")
    ex.add_argument("--world-size", type=int, help="check this world size now")
    cmd = sub.add_parser("command", help="print the torchrun command for a script")
    cmd.add_argument("script")
    cmd.add_argument("--nnodes", type=int, default=1)
    cmd.add_argument("--nproc-per-node", type=int, required=True)
    cmd.add_argument("--rdzv-endpoint", default=None)
    sl = sub.add_parser("slurm", help="print an sbatch file that runs a script with torchrun")
    sl.add_argument("script")
    sl.add_argument("--nodes", type=int, required=True)
    sl.add_argument("--gpus-per-node", type=int, required=True)
    sl.add_argument("--time", default="00:30:00")
    sl.add_argument("--partition", default=None)
    return parser


def _list() -> None:
    for name, exp in experiments().items():
        settings = ", ".join(f"{k}={v!r}" for k, v in exp.defaults.items())
        print(f"{name:18s} {exp.title}  [{exp.lecture}]\n{'':18s} settings: {settings or '-'}")


def _export(args: argparse.Namespace, extra: list[str]) -> None:
    exp = get(args.experiment)
    sys.stdout.write(
        render(
            exp,
            script=args.script_name or _redirected_name(),
            out=args.out,
            world_size=args.world_size,
            **_settings(exp, extra),
        )
    )


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    try:
        if args.command == "list":
            _list()
            return 0
        if args.command == "export":
            _export(args, extra)
            return 0
        if extra:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        if args.command == "command":
            print(
                launch_command(
                    args.script,
                    nproc_per_node=args.nproc_per_node,
                    nnodes=args.nnodes,
                    rdzv_endpoint=args.rdzv_endpoint,
                )
            )
            return 0
        sys.stdout.write(
            slurm_script(
                args.script,
                nodes=args.nodes,
                gpus_per_node=args.gpus_per_node,
                time=args.time,
                partition=args.partition,
            )
        )
        return 0
    except (ValueError, TypeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
