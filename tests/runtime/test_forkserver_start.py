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


_INHERIT = """
import multiprocessing.forkserver, os, signal, sys
import course_lib
from course_lib.runtime import processes

def parent(rank, world_size):
    return os.getppid()

if __name__ == "__main__":
    processes.start_method()  # the parent's warm server
    server = multiprocessing.forkserver._forkserver._forkserver_pid
    for kill_first in (False, True):
        pid = os.fork()
        if pid == 0:
            processes.adopt_inherited_forkserver()
            if kill_first:  # the inherited server is gone: the child must start its own
                os.kill(server, signal.SIGKILL)
                while processes.forkserver_running():
                    pass
            ranks = course_lib.launch(parent, 2, timeout=60)
            own = multiprocessing.forkserver._forkserver._forkserver_pid
            print("killed" if kill_first else "kept", ranks == [server] * 2, own == server)
            sys.stdout.flush()
            os._exit(0)
        os.waitpid(pid, 0)
"""


@pytest.mark.slow  # two forkservers start cold (12 s)
def test_a_forked_child_launches_from_its_parents_server_and_starts_its_own_once_it_died():
    """What the grader's zygote relies on: a clean child forked from it hands out ranks from the
    zygote's warm server (no second cold start), and one whose inherited server died still
    launches, from a server of its own."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    done = subprocess.run(
        [sys.executable, "-c", _INHERIT],
        capture_output=True,
        text=True,
        timeout=100,
        cwd=root,
        env={**os.environ, "PYTHONPATH": root},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["kept", "True", "True", "killed", "False", "False"], done


_BY_FORK = """
import os, sys, threading
import multiprocessing.forkserver
from course_lib.runtime import processes
from course_lib.runtime.launch import launch

def where(rank, world_size):
    import torch.distributed as dist
    t = __import__("torch").ones(1)
    dist.all_reduce(t)
    return os.getppid(), "torch._dynamo" in sys.modules, t.item()

if __name__ == "__main__":
    if sys.argv[1] == "thread":  # a second Python thread: the server must not be a fork of this
        threading.Thread(target=threading.Event().wait, daemon=True).start()
    forked = processes.start_forkserver_by_fork()
    ppids, dynamo, sums = zip(*launch(where, 2))
    server = multiprocessing.forkserver._forkserver._forkserver_pid
    print(forked, os.getppid() != server, set(ppids) == {server}, all(dynamo), sums)
    with open(f"/proc/{server}/stat") as f:
        print("parent", int(f.read().rsplit(")", 1)[1].split()[1]) == os.getpid())
"""


@pytest.mark.slow  # imports torch._dynamo once in each of two interpreters
@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="counts threads in /proc")
def test_a_single_threaded_caller_is_its_own_servers_template_and_a_threaded_one_is_not(tmp_path):
    """The grader's zygote starts its forkserver as a fork of itself (nothing imported twice);
    ranks come from that server, torch._dynamo already there. With a second thread running the
    fork is refused and the stdlib's server (a new interpreter) starts instead."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    script = tmp_path / "by_fork.py"
    script.write_text(_BY_FORK)
    for mode, forked in (("alone", "True"), ("thread", "False")):
        proc = subprocess.run(
            [sys.executable, str(script), mode],
            capture_output=True,
            text=True,
            timeout=100,
            cwd=root,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert proc.stdout.splitlines() == [f"{forked} True True True (2.0, 2.0)", "parent True"], (
            mode,
            proc.stdout,
            proc.stderr[-2000:],
        )
