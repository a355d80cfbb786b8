"""What a launch leaves behind: the SIGTERM grace period, stale work directories."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time

import cloudpickle
import pytest
import torch.distributed as dist
from _runtime_helpers import rank_processes

import course_lib

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # ranks need not import this module
pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True)
def _no_rank_left_behind():
    course_lib.launch(_ok, 1)  # warm forkserver
    yield
    assert rank_processes() == [], "a rank outlived its launch"


def _ok(rank, world_size):
    return rank


def _slow_to_stop(rank, world_size, marker_dir):
    if rank == 2:  # its SIGTERM handler needs a moment, well inside the launcher's grace period
        def finish(signum, frame):
            time.sleep(0.3)
            with open(os.path.join(marker_dir, "rank2.finished"), "w") as f:
                f.write("cleaned up")
            os._exit(0)
        signal.signal(signal.SIGTERM, finish)
    dist.barrier()  # every handler is in place before rank 0 fails
    if rank == 0:
        raise RuntimeError("rank 0 fails first")
    time.sleep(30)  # rank 1 dies at once on SIGTERM; rank 2 takes 0.3 s


def test_every_rank_gets_the_whole_sigterm_grace_period(tmp_path):
    with pytest.raises(course_lib.LaunchError) as info:
        course_lib.launch(_slow_to_stop, 3, str(tmp_path), timeout=20)
    assert "rank 0 fails first" in info.value.failures[0]
    assert (tmp_path / "rank2.finished").read_text() == "cleaned up"


def test_a_work_directory_without_a_live_owner_is_reclaimed_by_the_next_launch(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(timeout=30)
    stale = tmp_path / f"course_lib_launch_pid{dead.pid}_abc"
    (stale / "sub").mkdir(parents=True)
    (stale / "rank0.out").write_text("left by a kernel that was restarted mid-launch")
    mine = tmp_path / f"course_lib_launch_pid{os.getpid()}_def"  # a live owner: kept
    mine.mkdir()
    unrelated = tmp_path / "course_lib_launch_notapid"
    unrelated.mkdir()
    assert course_lib.launch(_ok, 2) == [0, 1]
    assert not stale.exists()
    assert mine.exists() and unrelated.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([mine.name, unrelated.name])

