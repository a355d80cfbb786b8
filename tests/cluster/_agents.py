"""Start torchrun agents from a test: one (standalone) or several meeting at a c10d rendezvous
on this host, as several nodes of a cluster would. Every wait has a timeout; a test that times
out kills the agents' process groups (agents and ranks)."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def env() -> dict:
    e = dict(os.environ)
    e["PYTHONPATH"] = ROOT + os.pathsep + e.get("PYTHONPATH", "")
    e.pop("TORCHELASTIC_RUN_ID", None)
    return e


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", *args]


def _wait_listening(port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listened on 127.0.0.1:{port} within {timeout} s")


def run_agents(commands: list[list[str]], cwd, timeout: float,
               first_listens_on: int | None = None) -> list[subprocess.CompletedProcess]:
    """Start every command (each in its own session) and wait for all of them. With
    ``first_listens_on``, the others start once the first listens on that port: the first
    agent then hosts the rendezvous store, as the head node of a cluster job does."""
    procs = []
    done = []
    try:
        for i, c in enumerate(commands):
            procs.append(subprocess.Popen(c, cwd=cwd, env=env(), stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True,
                                          start_new_session=True))
            if i == 0 and first_listens_on is not None:
                _wait_listening(first_listens_on, timeout)
        for p, c in zip(procs, commands):
            out, err = p.communicate(timeout=timeout)
            done.append(subprocess.CompletedProcess(c, p.returncode, out, err))
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(5)
    return done


def two_nodes(script: str, cwd, *, nproc_per_node: int = 2, timeout: float = 90.0,
              extra: tuple[str, ...] = ()) -> list[subprocess.CompletedProcess]:
    """Two torchrun agents, node ranks 0 and 1, meeting at 127.0.0.1:<free port>; node 0
    starts first and hosts the rendezvous store (on a cluster: the head node's agent)."""
    port = free_port()
    common = ["--nnodes", "2", "--nproc-per-node", str(nproc_per_node), "--rdzv-backend", "c10d",
              "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"test{port}",
              "--max-restarts", "0"]
    return run_agents([torchrun(*common, "--node-rank", str(n), script, *extra) for n in (0, 1)],
                      cwd, timeout, first_listens_on=port)
