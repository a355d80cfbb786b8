"""Benchmarks of course_lib's own machinery: ``python -m course_tools.bench launch|virtual|ranks``.

``virtual``: the virtual cluster (``bench_virtual.py``): ZeRO Figure 1 and the 7B
table reproduced with FSDP2 on a fake process group, and a Llama-2-70B step on 512 virtual ranks.

``ranks``: persistent ranks against their peers (``bench_ranks.py``).

``launch``: how long a trivial 2-rank job (one gloo all_reduce of one float) takes end to end,
measured side by side in one run through

* ``course_lib.launch`` (forkserver with torch preloaded): the cold first call, then median,
  p99 and max of ``--warm`` calls (100 by default: a rare stall, such as the 5 s resolver
  time-out that once hit ~3 % of launches, shows in p99 and max, never in the median);
* plain ``torch.multiprocessing.spawn`` (every rank imports torch from scratch);
* ``accelerate.notebook_launcher`` if accelerate is installed. It forks the caller, which
  does not mix with a forkserver already running in the same process, so it is timed in a
  subprocess of its own.

Times are wall-clock seconds on this machine (shared cores make them noisy: read the medians,
not single runs; the header prints the load average). Targets for course_lib.launch on 2 cores:
median <= 0.1 s, p99 <= 0.3 s. Introduced in notebooks/00_start_here.ipynb.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Timing:
    """Wall-clock seconds of one launch method."""

    method: str
    cold_s: float  # the first call in a fresh process (start-up costs included)
    warm_s: list[float]  # the calls after it

    @property
    def median_s(self) -> float:
        return statistics.median(self.warm_s)

    @property
    def p99_s(self) -> float:
        """99th percentile, nearest rank: with 100 runs, the second slowest."""
        ordered = sorted(self.warm_s)
        return ordered[math.ceil(0.99 * len(ordered)) - 1]

    @property
    def max_s(self) -> float:
        return max(self.warm_s)


def _allreduce_job(rank: int, world_size: int) -> float:
    t = torch.ones(1)
    dist.all_reduce(t)  # sum over ranks: world_size
    return t.item()


def _spawn_entry(rank: int, world_size: int, store_path: str) -> None:
    # what a plain torch.multiprocessing.spawn user writes: set up and tear down the group
    store = dist.FileStore(store_path, world_size)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
    _allreduce_job(rank, world_size)
    dist.destroy_process_group()


def time_course_lib(world_size: int, warm_runs: int) -> Timing:
    import course_lib

    times = []
    for _ in range(1 + warm_runs):
        t0 = time.perf_counter()
        out = course_lib.launch(_allreduce_job, world_size)
        times.append(time.perf_counter() - t0)
        assert out == [float(world_size)] * world_size, out
    return Timing("course_lib.launch (forkserver)", times[0], times[1:])


def time_spawn(world_size: int, runs: int) -> Timing:
    import torch.multiprocessing as mp

    times = []
    for _ in range(runs):
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            mp.spawn(_spawn_entry, args=(world_size, os.path.join(tmp, "store")), nprocs=world_size)
            times.append(time.perf_counter() - t0)
    # spawn keeps nothing warm between calls: every run is a cold run, so the median is over all
    return Timing("torch.multiprocessing.spawn", times[0], times)


# Runs in a fresh interpreter: notebook_launcher forks its caller.
_ACCELERATE_SCRIPT = r"""
import json, socket, sys, time
import torch, torch.distributed as dist
from accelerate import notebook_launcher

def job():
    dist.init_process_group("gloo")          # env:// set up by the launcher
    t = torch.ones(1)
    dist.all_reduce(t)
    dist.destroy_process_group()

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])

times = []
for _ in range(1 + int(sys.argv[1])):
    port = free_port()                        # notebook_launcher's default is a fixed 29500
    t0 = time.perf_counter()
    notebook_launcher(job, num_processes=int(sys.argv[2]), use_port=port)
    times.append(time.perf_counter() - t0)
print("TIMES_JSON", json.dumps(times))
"""


def time_accelerate(world_size: int, warm_runs: int, timeout_s: float = 300.0) -> Timing | str:
    """Timing of accelerate.notebook_launcher, or a string saying why it was not measured."""
    try:
        import accelerate  # noqa: F401
    except ImportError:
        return "accelerate is not installed (pip install -c constraints.txt accelerate)"
    proc = subprocess.run(
        [sys.executable, "-c", _ACCELERATE_SCRIPT, str(warm_runs), str(world_size)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    for line in proc.stdout.splitlines():
        if line.startswith("TIMES_JSON "):
            times = json.loads(line.split(" ", 1)[1])
            return Timing("accelerate.notebook_launcher (fork)", times[0], times[1:])
    return f"accelerate run failed (exit {proc.returncode}): {proc.stderr.strip()[-500:]}"


def format_table(timings: list[Timing], baseline: str = "torch.multiprocessing.spawn") -> str:
    """Aligned table: method, cold s, warm median / p99 / max s, runs, speed-up vs baseline."""
    base = next((t.median_s for t in timings if t.method == baseline), None)
    header = (
        "method",
        "cold s",
        "warm median s",
        "p99 s",
        "max s",
        "warm runs",
        "speed-up vs spawn",
    )
    rows = [header]
    for t in timings:
        speedup = f"{base / t.median_s:.1f}x" if base else "n/a"
        rows.append(
            (
                t.method,
                f"{t.cold_s:.3f}",
                f"{t.median_s:.3f}",
                f"{t.p99_s:.3f}",
                f"{t.max_s:.3f}",
                str(len(t.warm_s)),
                speedup,
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def bench_launch(
    world_size: int = 2,
    warm_runs: int = 100,
    spawn_runs: int = 3,
    accelerate: bool = True,
    accelerate_runs: int = 10,
) -> list[Timing]:
    timings = [time_course_lib(world_size, warm_runs), time_spawn(world_size, spawn_runs)]
    if accelerate:
        acc = time_accelerate(world_size, accelerate_runs)
        if isinstance(acc, Timing):
            timings.append(acc)
        else:
            print(f"note: {acc}")
    return timings


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m course_tools.bench", description=(__doc__ or "").split("\n")[0]
    )
    sub = parser.add_subparsers(dest="what", required=True)
    p = sub.add_parser(
        "launch", help="launch overhead: course_lib.launch vs spawn vs notebook_launcher"
    )
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--warm", type=int, default=100, help="warm runs of course_lib.launch")
    p.add_argument("--spawn", type=int, default=3, help="runs of torch.multiprocessing.spawn")
    p.add_argument(
        "--accelerate-runs", type=int, default=10, help="warm runs of accelerate.notebook_launcher"
    )
    p.add_argument("--no-accelerate", action="store_true")
    v = sub.add_parser("virtual", help="virtual cluster: ZeRO Figure 1, 7B table, 70B on 512 ranks")
    v.add_argument(
        "--only",
        choices=("figure1", "7b", "70b"),
        action="append",
        help="run only these parts (repeatable); default: all three",
    )
    r = sub.add_parser(
        "ranks",
        help="persistent ranks in a notebook: %%ranks vs nbdistributed "
        "vs jupyter-distributed, through a real kernel (see course_tools/bench_ranks.py)",
    )
    r.add_argument("--runs", type=int, default=20, help="runs of the trivial cell")
    r.add_argument(
        "--nbdistributed-python",
        default=None,
        help="python of a virtual environment with nbdistributed and ipykernel installed",
    )
    r.add_argument(
        "--jupyter-distributed-python",
        default=None,
        help="python of a virtual environment with jupyter-distributed installed",
    )
    r.add_argument("--verbose", action="store_true", help="also print what each cell showed")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.what == "ranks":
        return _main_ranks(parser, args)
    if args.what == "virtual":
        from course_tools import bench_virtual as virtual_bench

        parts = set(args.only or ("figure1", "7b", "70b"))
        return virtual_bench.run(
            figure1="figure1" in parts, seven_b="7b" in parts, seventy_b="70b" in parts
        )
    if min(args.world_size, args.warm, args.spawn, args.accelerate_runs) < 1:
        parser.error(
            "--world-size, --warm, --spawn and --accelerate-runs must be positive; got "
            f"{args.world_size}, {args.warm}, {args.spawn}, {args.accelerate_runs}"
        )
    load = " ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"
    print(
        f"{args.world_size}-rank all_reduce of one float, gloo on CPU; torch {torch.__version__}, "
        f"{os.cpu_count()} logical CPUs, load average {load}; wall-clock seconds"
    )
    timings = bench_launch(
        args.world_size, args.warm, args.spawn, not args.no_accelerate, args.accelerate_runs
    )
    print(format_table(timings))
    print(summary_line(timings))
    return 0


def _main_ranks(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from course_tools import bench_ranks

    if args.runs < 1:
        parser.error(f"--runs must be positive; got {args.runs}")
    print(bench_ranks.header())
    results = bench_ranks.bench_ranks(
        args.runs, args.nbdistributed_python, args.jupyter_distributed_python, args.verbose
    )
    print(bench_ranks.format_table(results))
    for r in results:
        if r.note:
            print(f"note, {r.tool}: {r.note}")
    return 0


def summary_line(timings: list[Timing]) -> str:
    """course_lib.launch against its targets (median <= 0.1 s, p99 <= 0.3 s) and the others."""
    ours = timings[0]
    others = {t.method: t.median_s for t in timings[1:]}
    parts = [
        f"course_lib.launch over {len(ours.warm_s)} warm launches: median "
        f"{ours.median_s:.3f} s (target <= 0.1 s {'met' if ours.median_s <= 0.1 else 'NOT met'}), "
        f"p99 {ours.p99_s:.3f} s (target <= 0.3 s {'met' if ours.p99_s <= 0.3 else 'NOT met'}), "
        f"max {ours.max_s:.3f} s"
    ]
    parts += [f"{v / ours.median_s:.1f}x faster than {m}" for m, v in others.items()]
    return "; ".join(parts)


if __name__ == "__main__":
    sys.exit(main())
