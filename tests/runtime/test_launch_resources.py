"""No process outlives a launch, and repeated launches leave fds, threads and memory flat."""

from __future__ import annotations

import sys

import cloudpickle
import psutil
import pytest
import torch
import torch.distributed as dist
from _runtime_helpers import rank_processes

import course_lib
from course_lib.runtime.launch import helper_pids, shutdown_forkserver

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _allreduce(rank, world_size):
    t = torch.ones(4)
    dist.all_reduce(t)
    return t.sum().item()


def _fails_on_odd_calls(rank, world_size, i):
    if i % 2 and rank == 1:
        raise RuntimeError("planned failure")
    return _allreduce(rank, world_size)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_fifty_launches_leave_fds_threads_and_memory_flat():
    me = psutil.Process()
    for _ in range(3):  # warm up: forkserver, first imports, allocator pools
        course_lib.launch(_allreduce, 2)
    fds0, threads0, rss0 = me.num_fds(), me.num_threads(), me.memory_info().rss
    for i in range(50):
        try:  # mix successes and failures: both paths must clean up
            assert course_lib.launch(_fails_on_odd_calls, 2, i) == [8.0, 8.0]
        except course_lib.LaunchError as err:
            assert i % 2 and "planned failure" in err.failures[1] and "(first: rank 1)" in str(err)
    fds1, threads1, rss1 = me.num_fds(), me.num_threads(), me.memory_info().rss
    assert fds1 <= fds0 + 2, (fds0, fds1)
    assert threads1 <= threads0 + 1, (threads0, threads1)
    # RSS tolerance: 16 MiB (1024**2 B) for allocator noise; a leak of one launch's temporary
    # directory listing, pipes or result buffers per call would grow it steadily instead
    assert rss1 - rss0 < 16 * 1024**2, (rss0, rss1)
    assert rank_processes() == []


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_forkserver_is_the_only_long_lived_helper_and_can_be_stopped():
    course_lib.launch(_allreduce, 2)
    children = {p.pid for p in psutil.Process().children(recursive=False)}
    helpers = helper_pids()
    assert helpers and helpers <= children  # forkserver (+ resource tracker), kept on purpose
    assert rank_processes() == []
    shutdown_forkserver()
    assert multiprocessing_forkserver_pid() is None
    assert course_lib.launch(_allreduce, 2) == [8.0, 8.0]  # starts a fresh one (cold)
    assert multiprocessing_forkserver_pid() is not None


def multiprocessing_forkserver_pid():
    import multiprocessing.forkserver

    return multiprocessing.forkserver._forkserver._forkserver_pid
