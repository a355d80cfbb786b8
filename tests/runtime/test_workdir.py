"""Work directories are owned through a lock their owner holds for its lifetime: the reclaimer
removes a directory only when its lock is free, whatever the clock and the pid say."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import pytest

from course_lib.runtime import _workdir

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="flock")

# a process that makes a work directory, prints it, and lives until its stdin closes
_OWNER = """
import sys
from course_lib.runtime._workdir import _new_workdir
print(_new_workdir(), flush=True)
sys.stdin.read()
"""


@pytest.fixture
def owner(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen(
        [sys.executable, "-c", _OWNER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        yield proc, proc.stdout.readline().strip()
    finally:
        proc.kill()
        proc.wait(timeout=10)
        proc.stdin.close()
        proc.stdout.close()


def test_a_clock_step_never_removes_a_live_owners_directory(owner):
    proc, path = owner
    with open(os.path.join(path, "rank0.out"), "w") as f:
        f.write("printed by a rank\n")
    for stamp in (0, 4_102_444_800):  # its times as after a step back to 1970 or on to 2100
        os.utime(path, (stamp, stamp))
        _workdir._reclaim_stale_workdirs()
        assert os.path.exists(os.path.join(path, "rank0.out")), stamp
    proc.stdin.close()  # the owner exits: the kernel releases its lock
    proc.wait(timeout=30)
    _workdir._reclaim_stale_workdirs()
    assert not os.path.exists(path)


def test_the_lock_decides_not_the_pid(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    # a live pid (this test's parent) but a free lock: a dead owner whose pid was reused
    reused = tmp_path / f"course_lib_launch_pid{os.getppid()}_abc"
    reused.mkdir()
    (reused / "owner.lock").write_text("")
    mine = _workdir._new_workdir()  # held by this process: kept, also when seen from elsewhere
    assert not _workdir._owner_alive(os.getppid(), str(reused))
    assert _workdir._owner_alive(os.getpid(), mine)
    _workdir._reclaim_stale_workdirs()
    assert not reused.exists() and os.path.exists(mine)
    _workdir._remove_workdir(mine)
    assert not os.path.exists(mine) and mine not in _workdir._held
