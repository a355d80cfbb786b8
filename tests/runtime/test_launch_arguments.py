"""Bad arguments are rejected before any process starts, naming parameter, value and choices."""

from __future__ import annotations

import math
import threading

import pytest
import torch
import torch.multiprocessing

import course_lib


def _fn(rank, world_size, *args, **kwargs):
    return rank


@pytest.fixture(autouse=True)
def _no_process_may_start(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a process was started for invalid arguments")

    monkeypatch.setattr(torch.multiprocessing, "start_processes", refuse)


@pytest.mark.parametrize(
    "world_size, error",
    [
        (0, ValueError),
        (-1, ValueError),
        (2.5, TypeError),
        ("2", TypeError),
        (True, TypeError),
        (None, TypeError),
    ],
)
def test_world_size_must_be_a_positive_int(world_size, error):
    with pytest.raises(error, match=r"world_size = .*: expected an int") as info:
        course_lib.launch(_fn, world_size)
    assert repr(world_size) in str(info.value)


@pytest.mark.parametrize(
    "backend, error", [("mpi", ValueError), ("NCCL", ValueError), ("", ValueError), (3, TypeError)]
)
def test_unknown_backend(backend, error):
    with pytest.raises(error, match=r"backend = .*: expected .*one of auto, gloo, nccl") as info:
        course_lib.launch(_fn, 2, backend=backend)
    assert repr(backend) in str(info.value)


@pytest.mark.skipif(
    torch.cuda.is_available() and torch.cuda.device_count() >= 64,
    reason="needs fewer GPUs than ranks",
)
def test_nccl_without_one_gpu_per_rank():
    n_gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    with pytest.raises(ValueError, match="nccl") as info:
        course_lib.launch(_fn, 64, backend="nccl")
    message = str(info.value)
    if torch.distributed.is_nccl_available():
        assert f"found {n_gpus} GPU" in message and "world_size = 64: expected" in message
    else:
        assert "not available in this PyTorch build" in message


@pytest.mark.parametrize(
    "timeout, error",
    [
        (0, ValueError),
        (-1.0, ValueError),
        (math.nan, ValueError),
        (math.inf, ValueError),
        ("60", TypeError),
        (None, TypeError),
        (True, TypeError),
    ],
)
def test_timeout_must_be_positive_seconds(timeout, error):
    with pytest.raises(error, match=r"timeout = .*: expected a number") as info:
        course_lib.launch(_fn, 2, timeout=timeout)
    assert repr(timeout) in str(info.value)


@pytest.mark.parametrize("threads, error", [(0, ValueError), (1.5, TypeError)])
def test_threads_per_rank_must_be_a_positive_int(threads, error):
    with pytest.raises(error, match=r"threads_per_rank = .*: expected an int"):
        course_lib.launch(_fn, 2, threads_per_rank=threads)


def test_unpicklable_positional_argument_is_named():
    with pytest.raises(
        TypeError, match=r"positional argument args\[1\] of type lock cannot be pickled"
    ):
        course_lib.launch(_fn, 2, 1.0, threading.Lock())


def test_unpicklable_keyword_argument_is_named():
    gen = (i for i in range(3))
    with pytest.raises(
        TypeError, match=r"keyword argument 'data' of type generator cannot be pickled"
    ):
        course_lib.launch(_fn, 2, data=gen)


def test_unpicklable_fn_is_named():
    lock = threading.Lock()

    def fn(rank, world_size):
        return lock.locked()

    with pytest.raises(TypeError, match=r"fn of type function cannot be pickled"):
        course_lib.launch(fn, 2)


@pytest.mark.parametrize("fn", [42, "fn", None])
def test_fn_must_be_callable(fn):
    with pytest.raises(TypeError, match=r"fn = .*: expected a callable") as info:
        course_lib.launch(fn, 2)
    assert repr(fn) in str(info.value)
