"""What a launch leaves behind and what it tells the caller while cleaning up: the SIGTERM grace
period, stale work directories, ranks killed by SIGKILL, large payloads."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import warnings

import cloudpickle
import pytest
import torch
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


def test_a_work_directory_without_a_live_owner_is_reclaimed_by_the_next_launch(
    tmp_path, monkeypatch
):
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


def _grows_then_dies(rank, world_size):
    if rank == 1:
        hog = torch.ones(64 * 2**20 // 4)  # 64 MiB, touched
        time.sleep(0.8)  # long enough for the launcher to see it
        hog.add_(1)
        os.kill(os.getpid(), signal.SIGKILL)  # what the out-of-memory killer does
    dist.barrier()


def test_a_rank_killed_by_sigkill_it_was_not_sent_by_the_launcher_suggests_out_of_memory():
    with pytest.raises(course_lib.LaunchError) as info:
        course_lib.launch(_grows_then_dies, 2, timeout=20)
    text = info.value.failures[1]
    assert "killed by signal SIGKILL" in text and "out of memory?" in text, text
    used = re.search(r"last seen using ([0-9.]+) (MiB|GiB)", text)  # while it was alive
    assert used and float(used[1]) * (1 if used[2] == "MiB" else 1024) > 64, text
    assert "out of memory?" in info.value.summary[1]


def _killed_by_sigterm(rank, world_size):
    if rank == 1:
        os.kill(os.getpid(), signal.SIGTERM)
    dist.barrier()


def test_other_signals_do_not_mention_memory():
    with pytest.raises(course_lib.LaunchError) as info:
        course_lib.launch(_killed_by_sigterm, 2, timeout=20)
    assert "killed by signal SIGTERM" in info.value.failures[1]
    assert "memory" not in info.value.failures[1]


BIG = torch.ones(56 * 2**20 // 4)  # 56 MiB that a rank function captures as a global


def _uses_big(rank, world_size):
    return float(BIG[rank])


@pytest.mark.slow
def test_a_large_captured_global_is_reported_once():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            assert course_lib.launch(_uses_big, 2) == [1.0, 1.0]
    messages = [str(w.message) for w in caught if "MiB" in str(w.message)]
    assert len(messages) == 1, messages
    assert "BIG" in messages[0] and "every launch" in messages[0] and "inside fn" in messages[0]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert course_lib.launch(_ok, 2) == [0, 1]  # a small payload: nothing to say
    assert not [w for w in caught if "MiB" in str(w.message)]
