"""Run an experiment in a notebook (``run``), from an exported script (``main``), and read the
results back (``load``).

Both paths call the same unit function, which calls ``course_lib.launch``. In a notebook,
launch starts the ranks; under torchrun this process already is one rank, and launch runs the
rank's share here and all-gathers every rank's outcome (runtime/_torchrun.py). Either way the
value is the one the notebook gets, and it is written as a results file (``results.py``) with
what the run was: experiment, settings, world size, launcher, backend, the host of every rank.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import os
import pathlib
import socket
import sys
import time
from typing import Any, NoReturn

from course_lib.cluster import results
from course_lib.cluster.experiment import Experiment, get
from course_lib.runtime.errors import LaunchError

# Seconds a rank that did not fail waits before it raises, so that the rank that did fail is
# the first failure on its node: torchrun names the failure with the earliest time stamp (whole
# seconds) as the root cause, and stops the node's other ranks as soon as one exits.
_STOP_DELAY_S = 1.5


@dataclasses.dataclass
class ClusterResult:
    """An experiment's value and what produced it (``meta``: experiment, settings, world_size,
    launcher, backend, hosts and node_ranks (one per rank), nodes, torch, started, wall_s)."""

    value: Any
    meta: dict

    @property
    def experiment(self) -> str:
        return self.meta["experiment"]

    def __repr__(self) -> str:
        m = self.meta
        return (
            f"ClusterResult({m['experiment']}: {m['world_size']} ranks on {m['nodes']} "
            f"node{'s' if m['nodes'] != 1 else ''} under {m['launcher']} ({m['backend']}), "
            f"{type(self.value).__name__})"
        )


def _probe(rank: int, world_size: int) -> dict:
    import torch.distributed as dist

    return {
        "host": socket.gethostname(),
        "backend": dist.get_backend(),
        "node_rank": int(os.environ.get("GROUP_RANK", 0)),
        "local_rank": int(os.environ.get("LOCAL_RANK", rank)),
    }


@contextlib.contextmanager
def _backend(exp: Experiment):
    """What ``backend='auto'`` means while the experiment runs (runtime/device.py)."""
    from course_lib.runtime.device import BACKEND_VARIABLE

    saved = os.environ.get(BACKEND_VARIABLE)
    if exp.backend != "auto":
        os.environ[BACKEND_VARIABLE] = exp.backend
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(BACKEND_VARIABLE, None)
        else:
            os.environ[BACKEND_VARIABLE] = saved


def _execute(exp: Experiment, world_size: int, settings: dict, launcher: str) -> ClusterResult:
    import torch

    import course_lib

    started = time.time()
    with _backend(exp):
        value = exp.run(world_size, **settings)
        wall = time.time() - started
        probe = course_lib.launch(_probe, world_size)
    meta = {
        "experiment": exp.name,
        "title": exp.title,
        "settings": settings,
        "world_size": world_size,
        "launcher": launcher,
        "backend": probe[0]["backend"],
        "hosts": [p["host"] for p in probe],
        "node_ranks": [p["node_rank"] for p in probe],
        "nodes": len({(p["host"], p["node_rank"]) for p in probe}),
        "varying": list(exp.varying),
        "torch": torch.__version__,
        "started": datetime.datetime.fromtimestamp(started).isoformat(timespec="seconds"),
        "wall_s": wall,
    }
    return ClusterResult(value, meta)


def run(
    experiment: str | Experiment,
    world_size: int | None = None,
    *,
    out: str | os.PathLike | None = None,
    **settings: Any,
) -> ClusterResult:
    """Run ``experiment`` here on ``world_size`` ranks with ``course_lib.launch``, as the lecture
    does, and return a :class:`ClusterResult` (written to ``out`` too when given). The same
    result an exported script gives under torchrun, which is what the tests compare."""
    from course_lib.runtime._torchrun import _under_torchrun

    exp = get(experiment)
    chosen = exp.settings(settings)
    world_size = exp.resolve_world_size(world_size, chosen)
    res = _execute(exp, world_size, chosen, "torchrun" if _under_torchrun() else "launch")
    if out is not None:
        results.write_atomic(out, results.dumps(res.value, res.meta))
    return res


def load(path: str | os.PathLike) -> ClusterResult:
    """The :class:`ClusterResult` an exported script wrote to ``path``."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"path = {str(path)!r}: no results file there (an exported "
            "script writes one on rank 0 when its run ends)"
        )
    value, meta = results.loads(path.read_text())
    return ClusterResult(value, meta)


class OneLineParser(argparse.ArgumentParser):
    """argparse, with a mistake on the command line said in one line on stderr (exit status 2),
    as every other refusal of an exported script and of ``python -m course_lib.cluster``."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message} (--help lists them all)\n")


def _parser(exp: Experiment, settings: dict) -> argparse.ArgumentParser:
    p = OneLineParser(
        description=f"{exp.name}: {exp.title}. Under torchrun every process is one rank; run "
        "with plain python it starts its own ranks with course_lib.launch.",
        allow_abbrev=False,  # --bucket-cap is not --bucket-cap-mb, as export says too
    )
    p.add_argument("--out", help="results file (JSON), written by rank 0")
    p.add_argument(
        "--world-size",
        type=int,
        default=None,
        help="ranks to start when run without torchrun (torchrun sets it otherwise)",
    )
    for key, default in settings.items():
        shown = ",".join(map(str, default)) if isinstance(default, tuple) else default
        p.add_argument(
            "--" + key.replace("_", "-"), dest=key, default=None, help=f"(default: {shown})"
        )
    return p


def main(
    experiment: str,
    settings: dict | None = None,
    *,
    out: str | None = None,
    world_size: int | None = None,
    argv: list[str] | None = None,
    end_process: bool = False,
) -> ClusterResult | None:
    """The body of an exported script. Settings on the command line override ``settings``.

    Under torchrun (TORCHELASTIC_RUN_ID set) each process runs its rank, rank 0 writes the
    results, and a failure is recorded in torchrun's error file (``@record``): the rank that
    raised gives its own traceback, every other rank says which rank failed. With
    ``end_process`` (an exported script's last statement), a rank that succeeded ends its
    process there (:func:`_end_rank`). Run with plain python, it starts ``--world-size`` ranks
    (default: the exported one) with launch.
    """
    from course_lib.runtime._torchrun import _under_torchrun

    exp = get(experiment)
    chosen = exp.settings(settings)
    args = _parser(exp, chosen).parse_args(sys.argv[1:] if argv is None else argv)
    overrides = {
        k: v for k, v in vars(args).items() if k not in ("out", "world_size") and v is not None
    }
    size = world_size if args.world_size is None else args.world_size
    if _under_torchrun():
        size = int(os.environ["WORLD_SIZE"])
    try:  # a bad setting or world size: the one line `python -m course_lib.cluster export` prints
        chosen = exp.settings({**chosen, **overrides})
        size = exp.resolve_world_size(size, chosen)
        exp.check_run(size, chosen)  # the unit's own checks, before any rank starts
    except (ValueError, TypeError) as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    path = pathlib.Path(args.out or out or f"{exp.name.replace('.', '_')}_results.json")
    if not _under_torchrun():
        res = run(exp, size, out=path, **chosen)
        print(f"{exp.name}: {res.meta['world_size']} ranks (launch); wrote {path}")
        return res

    from torch.distributed.elastic.multiprocessing.errors import record

    ranks = record(_torchrun_main)(exp, chosen, path)
    if end_process:
        _end_rank()
    return ranks


def _end_rank() -> NoReturn:
    """End this torchrun rank's process once its run succeeded (and rank 0 wrote the results):
    every rank at a barrier, the process group destroyed, output flushed, then ``os._exit(0)``,
    before the interpreter's own teardown. In that teardown a rank whose work was done aborted
    in 2 of 111 two-node runs of unit 18's script here ("terminate called without an active
    exception": a C++ thread still running as the process ended); torchrun counts that rank as
    failed, and the other node's agent waits at its exit barrier for it."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _torchrun_main(exp: Experiment, chosen: dict, path: pathlib.Path) -> ClusterResult:
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    try:
        res = _execute(exp, world_size, chosen, "torchrun")
    except LaunchError as err:
        failed = sorted(err.failures)
        if rank in failed:
            raise RuntimeError(
                f"{exp.name}: rank {rank} of {world_size} failed on "
                f"{socket.gethostname()}:\n{err.failures[rank]}"
            ) from None
        time.sleep(_STOP_DELAY_S)
        first = err.failures[failed[0]].splitlines()[0]
        raise RuntimeError(
            f"{exp.name}: rank{'s' if len(failed) > 1 else ''} "
            f"{', '.join(map(str, failed))} of {world_size} failed "
            f"(rank {failed[0]} {first}); rank {rank} stopped with "
            f"{'them' if len(failed) > 1 else 'it'}"
        ) from None
    if rank == 0:
        results.write_atomic(path, results.dumps(res.value, res.meta))
        nodes = res.meta["nodes"]
        print(
            f"{exp.name}: {world_size} ranks on {nodes} node{'s' if nodes != 1 else ''} under "
            f"torchrun ({res.meta['backend']}); wrote {path}",
            flush=True,
        )
    return res
