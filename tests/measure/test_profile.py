"""measure.profile: a step under torch.profiler as a typed table, a timeline and a trace file;
the FLOPs it counts are exact; collectives are found by name, and their overlap with backward is
measured on spans; a 2-rank gloo DDP step's bucket all-reduces are found in its trace."""

from __future__ import annotations

import json
import os
import pickle

import pytest
import torch

from course_lib.measure import profile as P


def test_table_timeline_and_trace_of_a_step(tmp_path):
    a, b = torch.randn(32, 48), torch.randn(48, 16)

    def step():
        for _ in range(3):
            torch.relu(a @ b)

    prof = P.profile_step(step, trace_path=tmp_path / "step.json")
    table = prof.table()
    assert tuple(table.columns) == P.OP_COLUMNS
    mm = table[table.name == "aten::mm"].iloc[0]
    assert mm.calls == 3 and mm.flops == 3 * 2 * 32 * 48 * 16  # the profiler's 2mkn, exact
    assert list(table.self_cpu_us) == sorted(table.self_cpu_us, reverse=True)
    tl = prof.timeline()
    assert tuple(tl.columns) == (*P.SPAN_COLUMNS, "rank")
    assert list(tl.start_us) == sorted(tl.start_us) and tl.start_us.iloc[0] == 0
    assert (tl.name == "aten::matmul").sum() == 3 and set(tl.kind) == {"op"}
    assert prof.wall_us >= tl.duration_us.max() > 0
    events = json.loads((tmp_path / "step.json").read_text())["traceEvents"]
    assert sum(e.get("name") == "aten::mm" for e in events) == 3
    assert pickle.loads(pickle.dumps(prof)) == prof  # plain data: a rank can return it


def test_backward_nodes_are_spans_of_their_own_kind():
    w = torch.randn(8, 8, requires_grad=True)
    prof = P.profile_step(lambda: (torch.randn(4, 8) @ w).sum().backward(), warmup=0)
    kinds = {s.kind for s in prof.spans}
    assert {"op", "backward"} <= kinds and prof.comm() == []


def test_span_kinds():
    assert P.span_kind("gloo:all_reduce") == "comm"
    assert P.span_kind("nccl:all_reduce") == "comm"
    assert P.span_kind("ncclDevKernel_AllReduce_Sum_f32_RING_LL", on_device=True) == "comm"
    assert P.span_kind("autograd::engine::evaluate_function: MmBackward0") == "backward"
    assert P.span_kind("volta_sgemm_128x64_nn", on_device=True) == "kernel"
    assert P.span_kind("aten::mm") == "op"


def test_hidden_time_counts_backward_on_other_threads_only():
    spans = (
        P.Span("autograd::engine::evaluate_function: A", 1, 0.0, 10.0, "backward"),
        P.Span("autograd::engine::evaluate_function: B", 1, 12.0, 4.0, "backward"),
        P.Span("aten::copy_", 1, 16.0, 10.0, "op"),  # after backward: not compute that hides
        P.Span("gloo:all_reduce", 2, 5.0, 10.0, "comm"),  # 5-10 and 12-15 hidden: 8
        P.Span("gloo:all_reduce", 3, 15.0, 10.0, "comm"),  # 15-16 hidden: 1
        P.Span("c10d::allreduce_", 1, 4.0, 1.0, "comm"),  # dispatch only: not a collective
    )
    prof = P.StepProfile(0, (), spans, None, 26.0)
    comm = prof.comm()
    assert [s.start_us for s in comm] == [5.0, 15.0]
    assert [prof.hidden_us(s) for s in comm] == [8.0, 1.0]


def test_profiler_log_lines_are_hidden_and_other_lines_kept(capfd):
    def step():
        os.write(2, b"a line of the step's own\n")

    P.profile_step(step, warmup=0)
    err = capfd.readouterr().err
    assert "a line of the step's own" in err
    assert "SyncActivityProfilerHandler" not in err and "profiling started" not in err


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (dict(step=3), TypeError, "step = 3: expected a callable"),
        (dict(step=lambda: None, warmup=-1), ValueError, "warmup = -1"),
        (dict(step=lambda: None, rank=1.5), TypeError, "rank = 1.5"),
    ],
)
def test_bad_arguments(kwargs, error, message):
    with pytest.raises(error, match=message):
        P.profile_step(**kwargs)


@pytest.mark.slow
def test_finds_the_ddp_bucket_all_reduces_in_a_two_rank_gloo_trace(tmp_path):
    """Two real gloo ranks (course_lib.launch), torch's DDP, one profiled step each: one
    gloo:all_reduce per gradient bucket DDP built, on a thread other than backward's, and the
    trace files written. (Lecture 19's DDP cell prints the same facts.)"""
    from course_lib.units.u19_inside_the_step.run_profile import ddp_step_profiles

    profiles, buckets = ddp_step_profiles(2, trace_dir=tmp_path)
    assert buckets == 3
    for prof in profiles:
        reduces = [s for s in prof.comm() if s.name == "gloo:all_reduce"]
        assert len(reduces) == buckets
        main = {s.thread for s in prof.spans if s.kind == "backward"}
        assert main and not main & {s.thread for s in reduces}
        events = json.loads((tmp_path / f"ddp_rank{prof.rank}.json").read_text())["traceEvents"]
        assert sum(e.get("name") == "gloo:all_reduce" for e in events) == buckets
