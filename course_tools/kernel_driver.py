"""Drive a real Jupyter kernel cell by cell (``python -m course_tools.bench ranks`` and the
kernel tests in tests/runtime).

A small jupyter_client wrapper: start a kernel (of this interpreter, or of another virtual
environment's ``python``), run cells, collect stdout / stderr / error as a notebook shows them,
interrupt ("interrupt kernel": SIGINT to the kernel's process group), restart, close. Every wait
has a timeout. This checkout's ``course_lib`` goes first on the kernel's PYTHONPATH.
"""

from __future__ import annotations

import json
import os
import queue
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

REPO_ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Cell:
    stdout: str = ""
    stderr: str = ""
    error: tuple[str, str] | None = None
    traceback: str = ""
    finished: bool = False  # the kernel went idle within the timeout

    @property
    def text(self) -> str:
        return self.stdout + self.stderr + self.traceback


class Kernel:
    """``store_history``: what the cells are sent with (nbval and nbclient send False);
    ``displays_in_stdout``: append each displayed value's text/plain to ``stdout``."""

    def __init__(
        self,
        cwd: str,
        python: str | None = None,
        extra_env: dict[str, str] | None = None,
        module: str = "ipykernel_launcher",
        *,
        store_history: bool = True,
        displays_in_stdout: bool = True,
    ):
        from jupyter_client import KernelManager
        from jupyter_client.kernelspec import KernelSpecManager

        self._specs = tempfile.mkdtemp(prefix="course_lib_kernelspec_")
        spec_dir = os.path.join(self._specs, "bench")
        os.makedirs(spec_dir)
        with open(os.path.join(spec_dir, "kernel.json"), "w") as f:
            json.dump(
                {
                    "argv": [python or sys.executable, "-m", module, "-f", "{connection_file}"],
                    "display_name": "bench",
                    "language": "python",
                },
                f,
            )
        env = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
        env.update(extra_env or {})
        self.km = KernelManager(
            kernel_name="bench", kernel_spec_manager=KernelSpecManager(kernel_dirs=[self._specs])
        )
        self.km.start_kernel(cwd=cwd, env=env)
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=120)
        self._msg_id: str | None = None
        self._store_history = store_history
        self._displays_in_stdout = displays_in_stdout

    @property
    def pid(self) -> int:
        provisioner = self.km.provisioner  # a LocalProvisioner once the kernel has started
        return int(getattr(provisioner, "process").pid)  # noqa: B009 - not in the base class

    def descendants(self) -> list[psutil.Process]:
        try:
            children: list[psutil.Process] = psutil.Process(self.pid).children(recursive=True)
            return children
        except psutil.Error:
            return []

    def start(self, code: str) -> None:
        self._msg_id = self.kc.execute(code, store_history=self._store_history)

    def collect(self, timeout: float = 60.0) -> Cell:
        cell, msg_id, self._msg_id = Cell(), self._msg_id, None
        displays: dict[str, str] = {}  # display id -> its latest text (updates replace it)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                msg = self.kc.get_iopub_msg(
                    timeout=max(0.01, min(0.5, deadline - time.monotonic()))
                )
            except queue.Empty:
                continue
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                if content["name"] == "stdout":
                    cell.stdout += content["text"]
                else:
                    cell.stderr += content["text"]
            elif kind in ("execute_result", "display_data", "update_display_data"):
                key = content.get("transient", {}).get("display_id") or f"#{len(displays)}"
                displays[key] = content.get("data", {}).get("text/plain", "")
            elif kind == "error":
                cell.error = (content["ename"], content["evalue"])
                cell.traceback = "\n".join(content["traceback"])
            elif kind == "status" and content["execution_state"] == "idle":
                cell.finished = True
                break
        if self._displays_in_stdout:
            cell.stdout += "".join(text + "\n" for text in displays.values())
        return cell

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

    def run(self, code: str, timeout: float = 60.0) -> Cell:
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
            self.km.shutdown_kernel(now=False)  # a polite shutdown, as the notebook's menu does
        except Exception:
            self.km.shutdown_kernel(now=True)
        finally:
            time.sleep(0.5)
            psutil.wait_procs(leftovers, timeout=5)
            import shutil

            shutil.rmtree(self._specs, ignore_errors=True)
