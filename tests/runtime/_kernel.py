"""Drive a real IPython kernel through jupyter_client, the way a notebook does (not a test module).

``Kernel`` is ``course_tools.kernel_driver.Kernel`` sending cells as nbval and nbclient do
(``store_history=False``) and reporting only what the cells print. ``interrupt`` is the
notebook's "interrupt kernel" button (SIGINT to the kernel process); ``restart`` its "restart
kernel". Every wait has a timeout, and ``close`` kills the kernel and any process it left behind.
"""

from __future__ import annotations

import os
import time

import psutil

from course_tools.kernel_driver import Cell as CellResult
from course_tools.kernel_driver import Kernel as _Driver

__all__ = ["CellResult", "Kernel", "wait_for"]


class Kernel(_Driver):
    def __init__(self, cwd: str | os.PathLike, extra_env: dict[str, str] | None = None):
        super().__init__(
            str(cwd), extra_env=extra_env, store_history=False, displays_in_stdout=False
        )

    def close(self) -> None:
        """Kill the kernel at once and every process it left (a test ends; no polite shutdown)."""
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
            import shutil

            shutil.rmtree(self._specs, ignore_errors=True)


def wait_for(predicate, timeout: float, interval: float = 0.05) -> bool:
    """Poll ``predicate`` until it is true or ``timeout`` seconds have passed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())
