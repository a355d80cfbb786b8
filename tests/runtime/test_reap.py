"""course_lib.runtime.reap: every descendant is found through /proc, also one in its own session
or orphaned, and killed; processes that existed before the block are left alone."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest

from course_lib.runtime import reap

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc (Linux)")

# a child that starts a grandchild in its own session, prints its pid, and (orphan) exits
_ORPHANING = """
import subprocess, sys
p = subprocess.Popen(
    [sys.executable, "-c", "import time; time.sleep(60)"],
    start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
)
print(p.pid, flush=True)
"""


def _gone(pid: int, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not reap._running(pid):
            return True
        time.sleep(0.05)
    return False


def test_descendants_in_their_own_session_are_found_and_killed():
    parent = subprocess.Popen(
        [sys.executable, "-c", _ORPHANING + "import time; time.sleep(60)"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        grandchild = int(parent.stdout.readline())
        assert os.getsid(grandchild) != os.getsid(parent.pid)  # its own session
        assert reap.descendants(parent.pid) == [grandchild]
        assert parent.pid in reap.descendants(os.getpid())
        assert reap.kill_descendants(parent.pid) == [grandchild]
        assert _gone(grandchild)
        assert parent.poll() is None  # the pid itself is not a descendant of itself
    finally:
        parent.kill()
        parent.wait(timeout=5)
        parent.stdout.close()


def test_orphans_started_in_the_block_are_killed_and_earlier_processes_kept():
    earlier = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with reap.no_process_left():
            assert reap._subreaper() is True
            done = subprocess.run(
                [sys.executable, "-c", _ORPHANING], capture_output=True, text=True, timeout=30
            )
            orphan = int(done.stdout)
            assert reap._running(orphan)  # its parent exited; it is still there, now ours
            assert orphan in reap.descendants(os.getpid())
        assert _gone(orphan)
        assert reap._subreaper() is False  # put back as it was
        assert earlier.poll() is None
    finally:
        earlier.kill()
        earlier.wait(timeout=5)


def test_processes_killed_with_their_parent_at_the_blocks_end_leave_no_zombie_here():
    """A chain started in the block (a parent, its child, theirs) is killed at its end all at
    once. The grandchildren die unreaped and come here as the parent dies (this process is the
    subreaper): they must be collected, not left as zombies that a later check counts as leaked.
    (Which of them dies first is up to the scheduler, so one run may not hit the late case.)"""
    chain = (
        "import subprocess, sys, time\n"
        "subprocess.Popen([sys.executable, '-c', {inner!r}])\n"
        "print('ready', flush=True); time.sleep(60)\n"
    )
    leaf = "import time; time.sleep(60)"
    middle = chain.format(inner=leaf)
    for _ in range(3):  # the order the kernel delivers the kills in varies: try it a few times
        with reap.no_process_left():
            top = subprocess.Popen(
                [sys.executable, "-c", chain.format(inner=middle)], stdout=subprocess.PIPE
            )
            assert top.stdout.readline() == b"ready\n"
            deadline = time.monotonic() + 30
            while len(reap.descendants(top.pid)) < 2:
                assert time.monotonic() < deadline, "the chain did not start"
                time.sleep(0.05)
            started = [top.pid, *reap.descendants(top.pid)]
        top.stdout.close()
        # reaped, not zombies: none of them is left in /proc
        assert [p for p in started if os.path.exists(f"/proc/{p}")] == []


def _zombie_children() -> list[int]:
    return [p.pid for p in psutil.Process().children() if p.status() == psutil.STATUS_ZOMBIE]


def test_orphans_that_exit_on_their_own_inside_the_block_are_reaped_at_its_end():
    """As a graded notebook's kernel does: a process in its own session (the kernel) starts one in
    that session (its forkserver), then exits. The orphan comes here (the block's subreaper) and
    exits on its own before the block ends: the kill pass skips it (it is not running), so without
    a reap it stays a zombie child of this process for good, one more per graded notebook."""
    kernel = (
        "import subprocess, sys\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(0.5)'])\n"
    )
    assert _zombie_children() == []
    with reap.no_process_left():
        started = subprocess.Popen([sys.executable, "-c", kernel], start_new_session=True)
        started.wait(timeout=30)  # a child started here, reaped by its Popen
        deadline = time.monotonic() + 30
        while not _zombie_children():  # the orphan came here and exited
            assert time.monotonic() < deadline, "the orphan did not exit"
            time.sleep(0.05)
        [orphan] = _zombie_children()
        assert os.getsid(orphan) == started.pid  # the session of the tree it came from
    assert _zombie_children() == []
    assert not os.path.exists(f"/proc/{orphan}")


def test_a_child_started_in_the_block_is_left_to_its_own_caller_to_reap():
    """A child of this process that exited inside the block is its Popen's to wait for (with its
    exit status): the block's end does not take it, whether it leads its own session or not."""
    with reap.no_process_left():
        own = subprocess.Popen([sys.executable, "-c", "exit(3)"], start_new_session=True)
        same = subprocess.Popen([sys.executable, "-c", "exit(4)"])
        deadline = time.monotonic() + 30
        while len(_zombie_children()) < 2:
            assert time.monotonic() < deadline, "the children did not exit"
            time.sleep(0.05)
    assert (own.wait(timeout=5), same.wait(timeout=5)) == (3, 4)
