"""Persistent ranks in a notebook, measured against the peers: ``python -m course_tools.bench ranks``.

Every tool is driven the way a learner drives it: through a real Jupyter kernel (jupyter_client),
cell by cell, on this machine, 4 ranks on CPU. For each tool it measures

* start: wall-clock seconds from the cell that starts 4 ranks until all 4 answer a cell (a tool
  may return before its workers are ready); the first start in a kernel pays one-off imports,
  so a second start (stop, start) is reported too where the tool can do it;
* trivial cell: median wall-clock seconds, as the notebook sees them (execute -> idle), of a
  cell that runs ``rank`` on the 4 ranks (target for %%ranks: <= 50 ms);
* interrupt: a cell sleeping 30 s on every rank, "interrupt kernel" after 1 s: seconds until
  the kernel is idle again, and whether the ranks still answer (and kept their state) after;
* a rank that raises: whether the cell fails, names the rank, and the others still answer;
* processes left: the kernel is shut down (as from the notebook's menu) while the ranks run.

Peers: ``nbdistributed`` (PyPI 0.1.0) and ``jupyter-distributed`` (PyPI 0.1.1), each in a
separate virtual environment given with ``--nbdistributed-python`` /
``--jupyter-distributed-python`` (never course dependencies). A peer that cannot be installed or
run is reported with the reason. Introduced in notebooks/08_collectives.ipynb.
"""

from __future__ import annotations

import dataclasses
import json
import os
import queue
import re
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

import psutil

from course_tools import kernel_driver


@dataclass(frozen=True)
class Tool:
    """How to drive one tool: its kernel's python and the cells that do each thing."""

    name: str
    python: str  # interpreter whose ipykernel runs the notebook
    setup: str  # cell: load the extension
    start: str  # cell: start 4 ranks
    trivial: str  # cell: every rank prints alive-<rank>
    set_state: str  # cell: every rank sets `x = 10 * rank`
    read_state: str  # cell: every rank shows `x`
    sleep: str  # cell: every rank sleeps 30 s
    raise_on_1: str  # cell: rank 1 raises ValueError('boom-1'), the others return rank
    stop: str  # cell: stop the ranks
    start_again: bool = True  # whether `stop` leaves the tool able to start a second set
    kernel_module: str = "ipykernel_launcher"  # what the kernel's python runs (`-m`)
    env: tuple[tuple[str, str], ...] = ()  # (name, value) pairs for the kernel's environment


COURSE = Tool(
    "course_lib %%ranks",
    "",
    "%load_ext course_lib.ranks",
    "%ranks start 4",
    "%%ranks\nprint(f'alive-{rank}')",
    "%%ranks\nx = 10 * rank",
    "%%ranks\nprint(f'x={x}')",
    "%%ranks\nimport time\ntime.sleep(30)",
    "%%ranks\nif rank == 1:\n    raise ValueError('boom-1')\nrank",
    "%ranks stop",
)

# Its %dist_shutdown (and %dist_reset) end with `pkill -f worker.py`, `pkill -9 -f python.*worker`
# and `pkill -9 -f torch.*distributed`: they kill every matching process of the user, other
# notebooks' and programs' included. The benchmark never calls them: it unloads the extension,
# whose own shutdown ends only the workers it started (and cannot start a second set after).
NBDISTRIBUTED = Tool(
    "nbdistributed 0.1.0",
    "",
    "%load_ext nbdistributed",
    "%dist_init -n 4",
    "print(f'alive-{rank}')",
    "x = 10 * rank",
    "print(f'x={x}')",
    "import time\ntime.sleep(30)",
    "if rank == 1:\n    raise ValueError('boom-1')\nrank",
    "%unload_ext nbdistributed",
    start_again=False,
)


# A proxy kernel: every cell runs on WORLD_SIZE ordinary ipykernels (the ranks, started with the
# proxy's first cell); it sets MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE, the cell makes the group.
JUPYTER_DISTRIBUTED = Tool(
    "jupyter-distributed 0.1.1",
    "",
    "",
    "import torch, torch.distributed as dist\ndist.init_process_group('gloo')\nrank = dist.get_rank()",
    "print(f'alive-{rank}')",
    "x = 10 * rank",
    "print(f'x={x}')",
    "import time\ntime.sleep(30)",
    "if rank == 1:\n    raise ValueError('boom-1')\nrank",
    "",
    start_again=False,
    kernel_module="jupyter_distributed.kernel",
    env=(("JUPYTER_DISTRIBUTED_WORLD_SIZE", "4"), ("JUPYTER_DISTRIBUTED_BASE_KERNEL", "python3")),
)


@dataclass
class Result:
    tool: str
    start_cell_s: float | None = None  # the start cell returned
    start_s: float | None = None  # every rank answered a cell
    restart_s: float | None = None
    trivial_median_s: float | None = None
    trivial_runs: int = 0
    interrupt_s: float | None = None
    interrupt_after: str = ""
    raise_behaviour: str = ""
    note: str = ""
    leftover_processes: int | None = None
    details: dict[str, Any] = field(default_factory=dict)


# "rank 1: raised ...", "[Rank 1 — error]", "error on rank 1" (not a mere "Rank 1:" header)
_NAMES_RANK_1 = re.compile(
    r"rank 1\b[^\n]{0,12}(error|fail|raise)|(error|fail)[^\n]{0,40}rank 1\b", re.IGNORECASE
)


def _all_alive(cell: kernel_driver.Cell) -> bool:
    return cell.finished and all(f"alive-{r}" in cell.stdout for r in range(4))


def _shown(cell: kernel_driver.Cell) -> str:
    return (cell.stdout + cell.stderr + cell.traceback).strip()


def _open_kernel(tool: Tool, cwd: str) -> kernel_driver.Kernel:
    # nbdistributed starts its workers as `python` from PATH: put the environment's bin
    # first, as activating it would (without, its workers fail: ModuleNotFoundError zmq)
    path = os.pathsep.join([os.path.dirname(tool.python), os.environ.get("PATH", "")])
    env = dict(tool.env, **({"PATH": path} if tool.python else {}))
    return kernel_driver.Kernel(
        cwd, python=tool.python or None, extra_env=env, module=tool.kernel_module
    )


def _start(kernel: kernel_driver.Kernel, tool: Tool, result: Result) -> bool:
    """Set up and start the ranks; whether every rank answers a cell (within 180 s)."""
    setup = kernel.run(tool.setup + "\nimport torch", timeout=120) if tool.setup else None
    if setup is not None and setup.error:
        result.note = f"setup failed: {_shown(setup)[-300:]}"
        return False
    t0 = time.perf_counter()
    started = kernel.run(tool.start, timeout=180)
    result.start_cell_s = time.perf_counter() - t0
    result.details["start output"] = _shown(started)[-400:]
    if started.error or not started.finished:
        result.note = f"start failed: {_shown(started)[-300:]}"
        return False
    # started = every rank answers a cell (a tool may return before its workers are ready)
    while not _all_alive(first := kernel.run(tool.trivial, timeout=60)):
        result.details.setdefault("cells before the ranks answered", []).append(
            _shown(first)[-200:]
        )
        if time.perf_counter() - t0 > 180:
            result.note = "the ranks did not answer within 180 s of the start cell"
            return False
    result.start_s = time.perf_counter() - t0
    result.details["trivial output"] = _shown(first)[-400:]
    return True


def _trivial_cells(kernel: kernel_driver.Kernel, tool: Tool, result: Result, runs: int) -> None:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        cell = kernel.run(tool.trivial, timeout=60)
        times.append(time.perf_counter() - t0)
        if cell.error or not _all_alive(cell):
            result.note = f"trivial cell failed: {_shown(cell)[-300:]}"
            break
    if times:
        result.trivial_median_s, result.trivial_runs = statistics.median(times), len(times)


def _raise_on_one(kernel: kernel_driver.Kernel, tool: Tool, result: Result) -> None:
    kernel.run(tool.set_state, timeout=60)
    raised = kernel.run(tool.raise_on_1, timeout=60)
    shown = _shown(raised)
    again = kernel.run(tool.read_state, timeout=30)
    usable = all(f"x={10 * r}" in again.stdout for r in range(4))
    if "boom-1" in shown and "Traceback" in shown or "line 2" in shown:
        text = "traceback shown"
    else:
        text = "message only" if "boom-1" in shown else "error text not shown"
    result.raise_behaviour = "; ".join(
        [
            "cell fails" if raised.error else "cell does NOT fail (no error in the notebook)",
            "names rank 1" if _NAMES_RANK_1.search(shown) else "rank not named",
            text,
            "others usable" if usable else "ranks not usable afterwards",
        ]
    )
    result.details["raise output"] = shown[-600:]


def _interrupt(kernel: kernel_driver.Kernel, tool: Tool, result: Result) -> None:
    kernel.start(tool.sleep)
    time.sleep(1.0)
    t0 = time.perf_counter()
    kernel.interrupt()
    interrupted = kernel.collect(timeout=60)
    result.interrupt_s = time.perf_counter() - t0 if interrupted.finished else None
    result.details["interrupt output"] = _shown(interrupted)[-600:]
    after = kernel.run(tool.read_state, timeout=30)
    kept = all(f"x={10 * r}" in after.stdout for r in range(4))
    result.interrupt_after = (
        "cell stopped; ranks answer, state kept"
        if kept
        else "ranks do not answer afterwards"
        if after.error or not after.finished
        else "ranks answer, state lost"
    )
    if not interrupted.finished:
        result.interrupt_after = "the kernel stayed busy for 60 s (not stopped)"
    result.details["after interrupt output"] = _shown(after)[-400:]


def _close_and_count(kernel: kernel_driver.Kernel, result: Result) -> None:
    """Shut the kernel down with the ranks running; count (then end) what it left behind."""
    procs = kernel.descendants()
    kernel.close()
    alive = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p)
        except psutil.Error:
            pass
    result.leftover_processes = len(alive)
    for p in alive:  # counted: now end them
        try:
            p.kill()
        except psutil.Error:
            pass


def measure(tool: Tool, trivial_runs: int = 20, cwd: str | None = None) -> Result:
    """Drive ``tool`` through a fresh kernel; every step has a timeout."""
    result = Result(tool.name)
    try:
        kernel = _open_kernel(tool, cwd or tempfile.mkdtemp(prefix="course_lib_bench_ranks_"))
    except Exception as exc:  # the kernel itself does not start in that environment
        result.note = f"kernel did not start: {exc}"
        return result
    try:
        if not _start(kernel, tool, result):
            return result
        _trivial_cells(kernel, tool, result, trivial_runs)
        _raise_on_one(kernel, tool, result)
        _interrupt(kernel, tool, result)
        if tool.start_again:
            kernel.run(tool.stop, timeout=60)
            t0 = time.perf_counter()
            again = kernel.run(tool.start, timeout=180)
            result.restart_s = time.perf_counter() - t0 if not again.error else None
    except queue.Empty as exc:
        result.note = f"no answer from the kernel: {exc!r}"
    finally:
        _close_and_count(kernel, result)
    return result


def _fmt(v: float | None, unit: str = "s") -> str:
    if v is None:
        return "n/a"
    return f"{v * 1000:.0f} ms" if unit == "ms" else f"{v:.2f} s"


def format_table(results: list[Result]) -> str:
    """A Markdown table: one row per tool."""
    rows = [
        "| tool | start 4 ranks: cell returns / ranks answer / a second start | trivial cell, "
        "median | interrupt: kernel idle after | after the interrupt | a rank raises | "
        "processes left after kernel shutdown |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        if r.note and r.start_s is None:
            rows.append(f"| {r.tool} | not measured: {r.note} | | | | | |")
            continue
        rows.append(
            f"| {r.tool} | {_fmt(r.start_cell_s)} / {_fmt(r.start_s)} / {_fmt(r.restart_s)} | "
            f"{_fmt(r.trivial_median_s, 'ms')} ({r.trivial_runs} runs) | "
            f"{_fmt(r.interrupt_s)} | {r.interrupt_after} | {r.raise_behaviour} | "
            f"{r.leftover_processes} |"
        )
    return "\n".join(rows)


def bench_ranks(
    trivial_runs: int = 20,
    nbdistributed_python: str | None = None,
    jupyter_distributed_python: str | None = None,
    verbose: bool = False,
) -> list[Result]:
    results = [measure(COURSE, trivial_runs)]
    if nbdistributed_python:
        results.append(
            measure(dataclasses.replace(NBDISTRIBUTED, python=nbdistributed_python), trivial_runs)
        )
    else:
        results.append(Result(NBDISTRIBUTED.name, note="no --nbdistributed-python given"))
    if jupyter_distributed_python:
        results.append(
            measure(
                dataclasses.replace(JUPYTER_DISTRIBUTED, python=jupyter_distributed_python),
                trivial_runs,
            )
        )
    else:
        results.append(
            Result(JUPYTER_DISTRIBUTED.name, note="no --jupyter-distributed-python given")
        )
    if verbose:
        for r in results:
            print(json.dumps({"tool": r.tool, **r.details}, indent=1))
    return results


def header() -> str:
    import torch

    load = " ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"
    return (
        f"4 ranks on CPU (gloo), driven through a Jupyter kernel; torch {torch.__version__}, "
        f"{os.cpu_count()} logical CPUs, load average {load}"
    )
