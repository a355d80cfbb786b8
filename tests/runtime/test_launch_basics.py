"""course_lib.launch: results, arguments, dynamic functions, rank output, speed, concurrency."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import textwrap
import threading
import time
import types

import cloudpickle
import pytest
import torch
import torch.distributed as dist
from _runtime_helpers import rank_processes

import course_lib

# Send this module's rank functions by value, as a notebook's would be: the ranks then do not
# import this test module (and pytest with it) on every launch.
cloudpickle.register_pickle_by_value(sys.modules[__name__])
pytestmark = pytest.mark.timeout(60)


def _sum_of_ranks(rank, world_size):
    t = torch.tensor([float(rank)])
    dist.all_reduce(t)  # 0 + 1 + ... + (world_size - 1)
    return rank, world_size, t.item()


def test_returns_values_in_rank_order():
    out = course_lib.launch(_sum_of_ranks, 4)
    assert out == [(r, 4, 6.0) for r in range(4)]
    assert rank_processes() == []


def test_single_rank():
    assert course_lib.launch(_sum_of_ranks, 1) == [(0, 1, 0.0)]


def _with_args(rank, world_size, tensor, offset, *, scale, tag="default"):
    return (tensor * scale + offset + rank).tolist(), tag


def test_args_and_kwargs_pass_through():
    out = course_lib.launch(_with_args, 2, torch.arange(3.0), 10, scale=2.0, tag="t")
    assert out == [([10.0, 12.0, 14.0], "t"), ([11.0, 13.0, 15.0], "t")]
    out = course_lib.launch(
        _with_args, 2, torch.zeros(1), 0, scale=1.0
    )  # default kwarg in the rank
    assert [tag for _, tag in out] == ["default", "default"]


def test_function_from_a_dynamic_main_module():
    # what a script's __main__ or a notebook cell looks like from pickle's point of view:
    # the function's module cannot be imported by name in another process
    module = types.ModuleType("__main__")
    exec(
        textwrap.dedent("""
        import torch, torch.distributed as dist
        FACTOR = 3.0
        def fn(rank, world_size):
            t = torch.tensor([FACTOR * (rank + 1)])
            dist.all_reduce(t)
            return t.item()
    """),
        module.__dict__,
    )
    assert course_lib.launch(module.fn, 2) == [9.0, 9.0]


def test_closure_defined_inside_the_test():
    base = torch.tensor([5.0])

    def fn(rank, world_size):
        t = base + rank
        dist.broadcast(t, src=1)
        return t.item()

    assert course_lib.launch(fn, 3) == [6.0, 6.0, 6.0]


def _rank_facts(rank, world_size):
    return {
        "env": (os.environ["RANK"], os.environ["WORLD_SIZE"], os.environ["LOCAL_RANK"]),
        "threads": torch.get_num_threads(),
        "device": str(course_lib.rank_device()),
        "backend": dist.get_backend(),
        "caller_var": os.environ.get("COURSE_LIB_TEST_VAR"),
        "cwd": os.getcwd(),
    }


def test_rank_environment(monkeypatch, tmp_path):
    course_lib.launch(_sum_of_ranks, 1)  # the forkserver is up before the caller changes anything
    monkeypatch.setenv("COURSE_LIB_TEST_VAR", "set-after-start")
    monkeypatch.chdir(tmp_path)
    facts = course_lib.launch(_rank_facts, 2)
    for rank, f in enumerate(facts):
        assert f["env"] == (str(rank), "2", str(rank))
        assert f["threads"] == 1  # one intra-op thread per rank by default
        assert f["device"] == "cpu" and f["backend"] == "gloo"
        assert f["caller_var"] == "set-after-start"  # the caller's current environment
        assert f["cwd"] == str(tmp_path)
    assert [f["threads"] for f in course_lib.launch(_rank_facts, 2, threads_per_rank=2)] == [2, 2]


def _chatty(rank, world_size):
    time.sleep(0.05 * (world_size - rank))  # finish in reverse rank order
    print(f"hello from {rank}")
    print(f"second line {rank}")
    print(f"to stderr {rank}", file=sys.stderr)
    return rank


def test_rank_output_is_prefixed_and_in_rank_order(capsys):
    outputs = []
    for _ in range(2):
        course_lib.launch(_chatty, 3)
        outputs.append(capsys.readouterr())
    expected_out = "".join(
        f"[rank {r}] hello from {r}\n[rank {r}] second line {r}\n" for r in range(3)
    )
    expected_err = "".join(f"[rank {r}] to stderr {r}\n" for r in range(3))
    assert outputs[0].out == expected_out and outputs[0].err == expected_err
    assert outputs[1] == outputs[0]  # identical from run to run


def _silent(rank, world_size):  # no collective at all: ranks still must not break each other
    return rank


def test_ranks_without_collectives():
    for _ in range(5):
        assert course_lib.launch(_silent, 4) == [0, 1, 2, 3]


def _warns(rank, world_size):
    import warnings

    warnings.warn(f"careful on {rank}", UserWarning, stacklevel=1)


def test_warnings_reach_the_caller_prefixed(capsys):
    course_lib.launch(_warns, 2)
    err = capsys.readouterr().err
    assert "[rank 0]" in err and "UserWarning: careful on 0" in err
    assert "UserWarning: careful on 1" in err


def test_warm_launch_is_fast():
    course_lib.launch(_sum_of_ranks, 2)  # warm up the forkserver
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        course_lib.launch(_sum_of_ranks, 2)
        times.append(time.perf_counter() - t0)
    # loose bound for a shared CI machine; `python -m course_tools.bench launch` checks 0.1 s
    assert statistics.median(times) < 0.5, times


def test_two_threads_launching_at_once_do_not_collide():
    results, errors = {}, []

    def worker(name, offset):
        try:
            results[name] = [
                course_lib.launch(_with_args, 2, torch.zeros(1), offset, scale=1.0)
                for _ in range(3)
            ]
        except Exception as exc:  # reported below, with the thread's name
            errors.append((name, exc))

    threads = [threading.Thread(target=worker, args=(n, o)) for n, o in (("a", 100), ("b", 200))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=45)
    assert not errors, errors
    assert results["a"] == [[([100.0], "default"), ([101.0], "default")]] * 3
    assert results["b"] == [[([200.0], "default"), ([201.0], "default")]] * 3
    assert rank_processes() == []


_TWO_KERNELS_SCRIPT = """
import sys, torch, torch.distributed as dist, course_lib
def fn(rank, world_size, base):
    t = torch.tensor([base + rank])
    dist.all_reduce(t)
    return t.item()
if __name__ == "__main__":
    base = float(sys.argv[1])
    print("OK", [course_lib.launch(fn, 2, base) for _ in range(2)])
"""


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_two_processes_launching_at_once_do_not_collide(tmp_path):
    # two notebooks = two kernels = two independent callers with their own forkservers
    script = tmp_path / "caller.py"
    script.write_text(_TWO_KERNELS_SCRIPT)
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), base],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for base in ("10", "20")
    ]
    outs = [p.communicate(timeout=100) for p in procs]
    for (out, err), base in zip(outs, (10, 20)):
        assert f"OK {[[2.0 * base + 1] * 2] * 2}" in out, err


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_spawn_start_method_where_there_is_no_forkserver(monkeypatch):
    # Windows has no forkserver: ranks are spawned and import torch themselves (slow, but the
    # same behaviour: results, captured output, cleanup)
    from course_lib.runtime import processes

    monkeypatch.setattr(processes, "start_method", lambda: "spawn")
    assert course_lib.launch(_sum_of_ranks, 2) == [(0, 2, 1.0), (1, 2, 1.0)]
    assert rank_processes() == []
