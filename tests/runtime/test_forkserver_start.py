"""An interrupt that reaches the forkserver while its interpreter is still starting (the kernel's
whole process group gets "interrupt kernel") ends it quietly, and the ranks it forks later start
with SIGINT unblocked (processes.start_method starts it with SIGINT blocked until its handler is in)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = [
    pytest.mark.skipif(not hasattr(os, "fork"), reason="forkserver"),
    pytest.mark.timeout(120),
]

_SCRIPT = """
import multiprocessing.forkserver, os, signal, sys, time
from course_lib.runtime import processes
if sys.argv[1] == "early":
    processes.start_method()
    pid = multiprocessing.forkserver._forkserver._forkserver_pid
    os.kill(pid, signal.SIGINT)  # at once: the server is still in its interpreter's start-up
    _, status = os.waitpid(pid, 0)
    print("exit", os.waitstatus_to_exitcode(status))
else:
    import course_lib

    def blocked(rank, world_size):
        with open(f"/proc/{os.getpid()}/status") as f:
            mask = int(next(ln for ln in f if ln.startswith("SigBlk:")).split()[1], 16)
        return bool(mask & (1 << (signal.SIGINT - 1)))

    print("blocked", course_lib.launch(blocked, 2))
"""


def _run(mode: str) -> subprocess.CompletedProcess:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return subprocess.run(
        [sys.executable, "-c", _SCRIPT, mode],
        env=dict(os.environ, PYTHONPATH=root),
        capture_output=True,
        text=True,
        timeout=100,
    )


def test_an_interrupt_during_the_servers_start_up_ends_it_without_a_traceback():
    done = _run("early")
    assert done.stdout.strip() == "exit 130", (done.stdout, done.stderr)  # 128 + SIGINT, quietly
    assert "Traceback" not in done.stderr and "KeyboardInterrupt" not in done.stderr, done.stderr


@pytest.mark.slow  # a cold forkserver imports torch
@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads /proc")
def test_ranks_start_with_sigint_unblocked():
    done = _run("ranks")
    assert done.stdout.strip() == "blocked [False, False]", (done.stdout, done.stderr[-2000:])
