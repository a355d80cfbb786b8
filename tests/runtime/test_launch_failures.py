"""course_lib.launch failure behaviour: every failure is named, bounded in time, and cleaned up."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

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
    course_lib.launch(_ok, 1)  # warm forkserver: failure timings below exclude its cold start
    yield
    assert rank_processes() == [], "a rank outlived its launch"


def _ok(rank, world_size):
    return rank


def _one_rank_raises(rank, world_size):
    t = torch.ones(1)
    dist.all_reduce(t)
    if rank == 2:
        raise ValueError(f"bad shard {rank}")
    dist.all_reduce(t)  # the others wait here for rank 2, which never comes
    return rank


def test_a_raising_rank_is_named_with_type_message_and_traceback():
    t0 = time.monotonic()
    with pytest.raises(course_lib.LaunchError) as info:
        course_lib.launch(_one_rank_raises, 4)
    assert time.monotonic() - t0 < 10  # seconds, not the 60 s timeout
    err = info.value
    assert isinstance(err, RuntimeError)
    assert "ValueError: bad shard 2" in err.failures[2]
    assert "Traceback" in err.failures[2] and "_one_rank_raises" in err.failures[2]
    assert "(first: rank 2)" in str(err)
    assert set(err.summary) == {0, 1, 2, 3}
    # peers that were waiting in the collective fail too (connection closed) or are stopped
    for rank in (0, 1, 3):
        assert rank not in err.failures or "rank 2" in err.summary[rank]


def _every_rank_raises(rank, world_size):
    raise KeyError(f"missing key on rank {rank}")


def test_every_failing_rank_is_named():
    # Repeated: a rank that raised at once used to exit while a peer was still connecting,
    # and the peer reported "connectFullMesh failed" (about 1 launch in 4) instead of its error.
    for _ in range(12):
        with pytest.raises(course_lib.LaunchError) as info:
            course_lib.launch(_every_rank_raises, 3)
        assert sorted(info.value.failures) == [0, 1, 2]
        for rank, text in info.value.failures.items():
            assert f"KeyError: 'missing key on rank {rank}'" in text


def _killed_by_signal(rank, world_size):
    print(f"rank {rank} about to sync", flush=True)
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.barrier()


def test_a_rank_killed_by_a_signal_is_named_with_the_signal(capsys):
    with pytest.raises(course_lib.LaunchError) as info:
        course_lib.launch(_killed_by_signal, 3)
    assert "killed by signal SIGKILL" in info.value.failures[1]
    assert "(first: rank 1)" in str(info.value)
    assert "[rank 1] rank 1 about to sync" in capsys.readouterr().out  # output kept


def _exits(rank, world_size):
    if rank == 0:
        sys.exit(3)
    return rank


def test_sys_exit_in_a_rank_is_a_failure():
    with pytest.raises(course_lib.LaunchError) as info:
        course_lib.launch(_exits, 2)
    assert "SystemExit: 3" in info.value.failures[0]


def _skips_collective(rank, world_size):
    if rank != 1:
        dist.all_reduce(torch.ones(1))
    else:
        time.sleep(30)  # rank 1 never arrives at the all_reduce
    return rank


def test_a_skipped_collective_fails_within_the_timeout():
    t0 = time.monotonic()
    with pytest.raises(course_lib.LaunchError) as info:
        course_lib.launch(_skips_collective, 3, timeout=2.0)
    elapsed = time.monotonic() - t0
    assert elapsed < 2.0 + 4.0, elapsed
    err = info.value
    # ranks 0 and 2 time out inside the collective (the process-group timeout) ...
    assert {0, 2} <= set(err.failures)
    assert all("Timed out" in err.failures[r] or "timed out" in err.failures[r] for r in (0, 2))
    # ... and the rank that never arrived is named too: still running, stopped by the launcher
    assert 1 in err.summary and ("stopped" in err.summary[1] or "deadline" in err.summary[1])


def _hangs(rank, world_size):
    if rank == 1:
        time.sleep(60)
    return rank


def test_a_hung_rank_is_reported_at_the_deadline_with_its_stack():
    t0 = time.monotonic()
    with pytest.raises(course_lib.LaunchError) as info:
        course_lib.launch(_hangs, 2, timeout=1.5)
    assert time.monotonic() - t0 < 1.5 + 4.0
    err = info.value
    assert list(err.failures) == [1]
    assert "still running at the deadline (timeout=1.5 s)" in err.failures[1]
    assert "_hangs" in err.failures[1]  # the faulthandler stack shows where it hung
    assert "returned" in err.summary[0]


def _sleeps(rank, world_size):
    time.sleep(30)


_CTRL_C = """
import os, signal, sys, threading, time
# what a fresh interpreter inherits that could stop an interrupt: the signal mask and dispositions
print("start: SIGINT blocked", signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, []),
      "handler", signal.getsignal(signal.SIGINT), file=sys.stderr)
import course_lib

def sleeps(rank, world_size):
    time.sleep(30)

def ok(rank, world_size):
    return rank

course_lib.launch(ok, 2)  # torch imported and the launcher warm, as in a kernel that launched before
timer = threading.Timer(1.0, signal.pthread_kill, args=(threading.main_thread().ident, signal.SIGINT))
t0 = time.monotonic()
timer.start()
try:
    course_lib.launch(sleeps, 3, timeout=30)
    print("no KeyboardInterrupt")
    sys.exit(1)
except KeyboardInterrupt:
    print(f"interrupted after {time.monotonic() - t0:.1f} s")
print(course_lib.launch(ok, 2))
"""


@pytest.mark.slow
def test_keyboard_interrupt_stops_every_rank_and_the_next_launch_works(tmp_path):
    # In a fresh interpreter, as a notebook kernel is. Inside the full suite this test saw its
    # interrupt lost (the launch ran to the end), also in a fresh interpreter, never when run
    # alone: what crosses exec is the signal mask and ignored dispositions, so the interpreter
    # starts as a kernel does, with SIGINT unblocked and at its default (the script prints both).
    import signal
    import subprocess

    def sigint_as_in_a_kernel():
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", _CTRL_C],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        preexec_fn=sigint_as_in_a_kernel,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("interrupted after "), proc.stdout
    assert float(lines[0].split()[2]) < 1.0 + 5.0  # all ranks gone within 5 s of the interrupt
    assert lines[-1] == "[0, 1]"
    assert time.monotonic() - t0 < 60
    assert rank_processes() == []


def _nested(rank, world_size):
    return course_lib.launch(_ok, 2)


def test_nested_launch_is_refused_clearly():
    with pytest.raises(course_lib.LaunchError) as info:
        course_lib.launch(_nested, 2)
    assert "nested" in info.value.failures[0]


def _returns_unpicklable(rank, world_size):
    return threading.Lock()


def test_an_unpicklable_return_value_is_named():
    with pytest.raises(course_lib.LaunchError) as info:
        course_lib.launch(_returns_unpicklable, 2)
    assert "return value of type lock cannot be pickled" in info.value.failures[0]


def test_launch_error_pickles_with_its_attributes():
    import pickle

    err = course_lib.LaunchError("msg", {1: "boom"}, {0: "returned normally", 1: "boom"})
    copy = pickle.loads(pickle.dumps(err))
    assert (str(copy), copy.failures, copy.summary) == (str(err), err.failures, err.summary)
