"""Several torchrun agents on this machine, as several nodes of a cluster would run them.

Each agent is a separate ``torchrun --nnodes N --node-rank k`` process meeting the others at a
c10d rendezvous on 127.0.0.1 (a free port); node 0 starts first and hosts the rendezvous store,
as the head node of a cluster job does. The same script, the same flags as on a cluster; only
the addresses are local. Used by unit 14's lecture and by tests/cluster.
"""

from __future__ import annotations

import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence

from course_lib import validate


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict:
    env = dict(os.environ)
    root = str(pathlib.Path(__file__).resolve().parents[2])  # this course_lib, on every rank
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    for name in (
        "TORCHELASTIC_RUN_ID",
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
    ):
        env.pop(name, None)
    return env


def _wait_listening(port: int, proc: subprocess.Popen, timeout: float) -> bool:
    """True once something listens on ``port``; False if ``proc`` ended first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return True
        time.sleep(0.05)
    raise TimeoutError(
        f"the first torchrun agent did not listen on 127.0.0.1:{port} within {timeout:g} s"
    )


def _tail(text: str | None, lines: int = 15) -> str:
    return "\n".join((text or "").rstrip().splitlines()[-lines:])


def torchrun_command(*args: str) -> list[str]:
    """``torchrun`` as this interpreter's ``python -m torch.distributed.run``."""
    return [sys.executable, "-m", "torch.distributed.run", *args]


def run_agents(
    commands: list[list[str]], cwd, *, timeout: float = 120.0, first_listens_on: int | None = None
) -> list[subprocess.CompletedProcess]:
    """Start every command (each in its own session) and wait for all, at most ``timeout``
    seconds; on time-out every agent's process group (agent and ranks) is killed and
    TimeoutError raised. With ``first_listens_on``, the others start once the first listens."""
    timeout = validate.number("timeout", timeout, positive=True)
    deadline = time.monotonic() + timeout
    procs: list[subprocess.Popen] = []
    done: list[subprocess.CompletedProcess] = []
    try:
        for i, cmd in enumerate(commands):
            procs.append(
                subprocess.Popen(
                    cmd,
                    cwd=cwd,
                    env=_env(),
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    start_new_session=True,
                )
            )
            if i == 0 and first_listens_on is not None:
                if not _wait_listening(first_listens_on, procs[0], timeout):
                    # the others would wait for its rendezvous until the deadline
                    out, err = procs[0].communicate()
                    raise RuntimeError(
                        f"the first torchrun agent exited with code {procs[0].returncode} "
                        f"before listening on 127.0.0.1:{first_listens_on}; its last "
                        f"output:\n{_tail(err) or _tail(out)}"
                    )
        for proc, cmd in zip(procs, commands):
            left = max(0.1, deadline - time.monotonic())
            try:
                out, err = proc.communicate(timeout=left)
            except subprocess.TimeoutExpired:
                raise TimeoutError(
                    f"torchrun agents still running after {timeout:g} s; killed them and "
                    f"their ranks. Their last output:\n{_outputs(procs, done)}"
                ) from None
            done.append(subprocess.CompletedProcess(cmd, proc.returncode, out, err))
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
    return done


def _outputs(procs: list[subprocess.Popen], done: list[subprocess.CompletedProcess]) -> str:
    """Kill the agents still running, then each one's last lines of stderr (else stdout); the
    output of those that finished (``done``, in order) was read already."""
    parts = []
    for i, proc in enumerate(procs):
        if i < len(done):
            out, err = done[i].stdout, done[i].stderr
        else:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            try:
                out, err = proc.communicate(timeout=5)
            except subprocess.TimeoutExpired:
                out = err = ""
        parts.append(f"--- agent {i} (exit {proc.returncode}):\n{_tail(err) or _tail(out)}")
    return "\n".join(parts)


def _run_nodes(
    script: pathlib.Path, nodes: int, nproc: int, args: Sequence[str], timeout: float
) -> list[subprocess.CompletedProcess]:
    """``nodes`` torchrun agents meeting through a c10d rendezvous on a free local port."""
    port = free_port()
    common = [
        "--nnodes",
        str(nodes),
        "--nproc-per-node",
        str(nproc),
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        "--rdzv-id",
        f"local{port}",
        "--max-restarts",
        "0",
    ]
    return run_agents(
        [
            torchrun_command(*common, "--node-rank", str(n), script.name, *args)
            for n in range(nodes)
        ],
        script.parent,
        timeout=timeout,
        first_listens_on=port,
    )


def torchrun_here(
    script: str | os.PathLike,
    *,
    nnodes: int = 2,
    nproc_per_node: int = 2,
    args: list[str] | tuple[str, ...] = (),
    timeout: float = 120.0,
    check: bool = True,
) -> list[subprocess.CompletedProcess]:
    """Run ``script`` under ``nnodes`` torchrun agents on this machine, as ``nnodes`` nodes of
    ``nproc_per_node`` ranks (``nnodes=1``: one ``--standalone`` agent). The working folder is
    the script's. Returns each agent's CompletedProcess (node 0 first); with ``check``, an agent
    that failed raises RuntimeError with the end of its report (torchrun names the failed rank)."""
    script = pathlib.Path(script).resolve()
    if not script.is_file():
        raise FileNotFoundError(f"script = {str(script)!r}: no such file")
    nodes = validate.count("nnodes", nnodes, minimum=1)
    nproc = validate.count("nproc_per_node", nproc_per_node, minimum=1)
    if nodes == 1:
        results = run_agents(
            [torchrun_command("--standalone", "--nproc-per-node", str(nproc), script.name, *args)],
            script.parent,
            timeout=timeout,
        )
    else:
        results = _run_nodes(script, nodes, nproc, args, timeout)
    if check:
        for node, res in enumerate(results):
            if res.returncode != 0:
                raise RuntimeError(
                    f"torchrun agent of node {node} exited with {res.returncode}:\n"
                    f"{res.stderr[-3000:]}"
                )
    return results
