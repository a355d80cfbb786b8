"""Drive a real IPython kernel through jupyter_client, the way a notebook does (not a test module).

``Kernel`` starts a ``python3`` kernel whose ``course_lib`` is this checkout's (PYTHONPATH is
set to the repository root), runs cells in it and collects what a notebook would show: stdout,
stderr and the error of a cell. ``interrupt`` is the notebook's "interrupt kernel" button
(SIGINT to the kernel process); ``restart`` its "restart kernel". Every wait has a timeout, and
``close`` kills the kernel and any process it left behind.
"""
from __future__ import annotations

import os
import queue
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from jupyter_client import KernelManager

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class CellResult:
    stdout: str = ""
    stderr: str = ""
    error: tuple[str, str] | None = None  # (ename, evalue) of an uncaught exception
    traceback: str = ""
    finished: bool = False  # the kernel went idle within the timeout

    @property
    def text(self) -> str:
        return self.stdout + self.stderr + self.traceback


@dataclass
class _Pending:
    msg_id: str
    result: CellResult = field(default_factory=CellResult)


class Kernel:
    def __init__(self, cwd: str | os.PathLike, extra_env: dict[str, str] | None = None):
        # ipykernel forwards what subprocesses write to its file descriptors 1 and 2 into the
        # cell, as in a notebook, except when it sees PYTEST_CURRENT_TEST: hide that from it
        env = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
        env.update(extra_env or {})
        self.km = KernelManager(kernel_name="python3")
        self.km.start_kernel(cwd=str(cwd), env=env)
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)
        self._pending: _Pending | None = None

    @property
    def pid(self) -> int:
        return self.km.provisioner.process.pid

    def descendants(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.pid).children(recursive=True)
        except psutil.Error:
            return []

    def start(self, code: str) -> None:
        """Send a cell without waiting for it (see ``collect``)."""
        self._pending = _Pending(self.kc.execute(code, store_history=False))

    def collect(self, timeout: float = 60.0) -> CellResult:
        """Gather the running cell's output until the kernel is idle again (or ``timeout``)."""
        pending, self._pending = self._pending, None
        assert pending is not None, "no cell is running"
        result = pending.result
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                msg = self.kc.get_iopub_msg(timeout=max(0.05, min(1.0, deadline - time.monotonic())))
            except queue.Empty:
                continue
            if msg.get("parent_header", {}).get("msg_id") != pending.msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                if content["name"] == "stdout":
                    result.stdout += content["text"]
                else:
                    result.stderr += content["text"]
            elif kind == "error":
                result.error = (content["ename"], content["evalue"])
                result.traceback = "\n".join(content["traceback"])
            elif kind == "status" and content["execution_state"] == "idle":
                result.finished = True
                break
        return result

    def drain(self, seconds: float) -> str:
        """Stream output that arrives within ``seconds``, whichever cell it is attributed to
        (output a subprocess writes to the kernel's stderr can land after its cell ended)."""
        text = ""
        deadline = time.monotonic() + seconds
        while (remaining := deadline - time.monotonic()) > 0:
            try:
                msg = self.kc.get_iopub_msg(timeout=min(remaining, 0.2))
            except queue.Empty:
                continue
            if msg["msg_type"] == "stream":
                text += msg["content"]["text"]
        return text

    def run(self, code: str, timeout: float = 60.0) -> CellResult:
        self.start(code)
        return self.collect(timeout)

    def interrupt(self) -> None:
        self.km.interrupt_kernel()

    def restart(self) -> None:
        self.km.restart_kernel(now=True)
        self.kc.wait_for_ready(timeout=60)

    def close(self) -> None:
        leftovers = self.descendants()
        try:
            self.kc.stop_channels()
            self.km.shutdown_kernel(now=True)
        finally:
            for p in leftovers:
                try:
                    p.kill()
                except psutil.Error:
                    pass
            psutil.wait_procs(leftovers, timeout=5)


def wait_for(predicate, timeout: float, interval: float = 0.05) -> bool:
    """Poll ``predicate`` until it is true or ``timeout`` seconds have passed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())
