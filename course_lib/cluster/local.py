"""Several torchrun agents on this machine, as several nodes of a cluster would run them.

Each agent is a separate ``torchrun --nnodes N --node-rank k`` process meeting the others at a
c10d rendezvous on 127.0.0.1 (a free port); node 0 starts first and hosts the rendezvous store,
as the head node of a cluster job does. The same script, the same flags as on a cluster; only
the addresses are local. Used by unit 14's lecture and by tests/cluster.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import signal
import socket
import subprocess
import sys
import threading
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


#: seconds the other agents get to end on their own once one agent has failed
PEER_FAILURE_GRACE_S = 30.0


def run_agents(
    commands: list[list[str]],
    cwd,
    *,
    timeout: float = 120.0,
    first_listens_on: int | None = None,
    grace: float = PEER_FAILURE_GRACE_S,
) -> list[subprocess.CompletedProcess]:
    """Start every command (each in its own session) and wait for all, at most ``timeout``
    seconds; on time-out every agent's process group (agent and ranks) is killed and
    TimeoutError raised. With ``first_listens_on``, the others start once the first listens.

    Once one agent has failed (a non-zero exit), the others get ``grace`` seconds to end on
    their own, then their process groups are killed (exit -9), as a cluster's scheduler ends a
    job whose node failed: an agent whose own ranks succeeded would otherwise wait at torchrun's
    exit barrier for the failed one (300 s) before it exits."""
    timeout = validate.number("timeout", timeout, positive=True)
    grace = validate.number("grace", grace, minimum=0.0)
    deadline = time.monotonic() + timeout
    procs: list[subprocess.Popen] = []
    try:
        _start_agents(procs, commands, cwd, first_listens_on, timeout)
        outputs = _wait_agents(procs, deadline, grace, timeout)
    finally:
        _kill_running(procs)
    return [
        subprocess.CompletedProcess(cmd, proc.returncode, *(outputs[i] or ("", "")))
        for i, (cmd, proc) in enumerate(zip(commands, procs))
    ]


def _start_agents(
    procs: list[subprocess.Popen],
    commands: list[list[str]],
    cwd,
    first_listens_on: int | None,
    timeout: float,
) -> None:
    """Start each command into ``procs`` (the caller kills them if this raises); with
    ``first_listens_on``, the others once the first listens."""
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


def _wait_agents(
    procs: list[subprocess.Popen], deadline: float, grace: float, timeout: float
) -> list[tuple[str, str] | None]:
    """Wait for every agent (see :func:`run_agents`); each one's (stdout, stderr)."""
    # every agent's output read as it comes (a full pipe would stop the agent writing it)
    outputs: list[tuple[str, str] | None] = [None] * len(procs)
    readers = [
        threading.Thread(target=_read, args=(p, outputs, i), daemon=True)
        for i, p in enumerate(procs)
    ]
    for reader in readers:
        reader.start()
    failed_at = None
    while any(proc.poll() is None for proc in procs):
        now = time.monotonic()
        if now >= deadline:
            raise TimeoutError(
                f"torchrun agents still running after {timeout:g} s; killed them and "
                f"their ranks. Their last output:\n{_outputs(procs, readers, outputs)}"
            )
        if failed_at is None and any(proc.poll() not in (None, 0) for proc in procs):
            failed_at = now
        if failed_at is not None and now - failed_at >= grace:
            _kill_running(procs)  # a node failed: the job ends (their exit code is -9)
            break
        time.sleep(0.05)
    for reader in readers:
        reader.join(10)
    return outputs


def _read(proc: subprocess.Popen, outputs: list, i: int) -> None:
    outputs[i] = proc.communicate()


def _kill_running(procs: list[subprocess.Popen]) -> None:
    """SIGKILL the process group (agent and ranks) of every agent still running; reap them."""
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)


def _outputs(procs: list[subprocess.Popen], readers: list[threading.Thread], outputs: list) -> str:
    """Kill the agents still running, then each one's last lines of stderr (else stdout)."""
    _kill_running(procs)
    parts = []
    for i, proc in enumerate(procs):
        readers[i].join(5)
        out, err = outputs[i] or ("", "")
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
        failed = [(node, res) for node, res in enumerate(results) if res.returncode != 0]
        if failed:
            # the node that failed on its own first; those killed after it (-9) say why below
            node, res = next(((n, r) for n, r in failed if r.returncode != -9), failed[0])
            killed = [n for n, r in failed if r.returncode == -9 and n != node]
            also = (
                f" (node{'s' if len(killed) > 1 else ''} {', '.join(map(str, killed))} "
                "killed once it had failed)"
                if killed
                else ""
            )
            raise RuntimeError(
                f"torchrun agent of node {node} exited with {res.returncode}{also}:\n"
                f"{res.stderr[-3000:]}"
            )
    return results
