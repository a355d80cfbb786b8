"""The rank-check pieces units 08-12 share across the grading wall: the calls a learner's code makes
to torch.distributed (course_lib.grading.calls) and a parity run's harness Record
(course_lib.grading.records), each written on the learner's side and read back, checked, on the
judge's: exact behaviour, and a ✗ verdict for anything malformed."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from course_lib.grading import plain
from course_lib.grading.calls import CallLog, need_records, need_runs, other_calls, sent_bytes
from course_lib.grading.records import first_mismatch, named_tensors, need_record, plain_record
from course_lib.parallel.harness import Record, compare


# --------------------------------------------------------------------------- calls
def test_call_log_records_op_payload_and_async_then_restores():
    before = dist.all_reduce, dist.distributed_c10d.all_reduce
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)  # one rank
    try:
        with CallLog() as log:
            dist.all_reduce(torch.ones(10))  # 40 bytes
            dist.all_reduce(torch.ones(3, dtype=torch.float64), async_op=True).wait()
            dist.distributed_c10d.broadcast(torch.ones(2), src=0)
        dist.all_reduce(torch.ones(1))  # after the block: not logged
    finally:
        dist.destroy_process_group()
    assert log.records == [
        {"op": "all_reduce", "bytes": 40, "async": False},
        {"op": "all_reduce", "bytes": 24, "async": True},
        {"op": "broadcast", "bytes": 8, "async": False},
    ]
    assert log.calls == {"all_reduce": 2, "broadcast": 1}
    assert (dist.all_reduce, dist.distributed_c10d.all_reduce) == before
    assert plain.roundtrip(log.records) == need_records(1, plain.roundtrip(log.records), "rank 0")


def test_the_judge_prices_point_to_point_sends_only():
    records = [
        {"op": "isend", "bytes": 100, "async": True},
        {"op": "send", "bytes": 20, "async": False},
        {"op": "irecv", "bytes": 100, "async": True},
        {"op": "all_reduce", "bytes": 8, "async": False},
        {"op": "all_reduce", "bytes": 8, "async": False},
    ]
    assert sent_bytes(records) == 120
    assert other_calls(records) == {"all_reduce": 2}


@pytest.mark.parametrize(
    "value",
    [
        None,
        {"op": "send", "bytes": 1, "async": False},  # one record, not a list
        [{"op": "send", "bytes": 1.0, "async": False}],
        [{"op": "send", "bytes": True, "async": False}],
        [{"op": 3, "bytes": 1, "async": False}],
        [{"op": "send", "bytes": 1, "async": "no"}],
        [{"op": "send", "bytes": 1}],
        ["send"],
    ],
)
def test_malformed_calls_are_a_verdict(value):
    with pytest.raises(AssertionError, match=r"^✗ task 2: rank 1: the run handed back no list of"):
        need_records(2, value, "rank 1")


def test_need_runs_wants_one_list_of_rank_dicts_per_world_size():
    runs = [[{}, {}], [{}, {}, {}]]
    assert need_runs(1, {"runs": runs}, (2, 3)) is runs
    for data in (None, {"runs": runs[:1]}, {"runs": [[{}], [{}, {}, {}]]}, {"runs": [[{}, 1], []]}):
        with pytest.raises(AssertionError, match=r"^✗ task 1: the run handed back no results for"):
            need_runs(1, data, (2, 3))


# --------------------------------------------------------------------------- records
def _record(shift: float = 0.0) -> Record:
    w0 = torch.arange(4.0).reshape(2, 2)
    g = torch.full((2, 2), 0.5 + shift)
    return Record(losses=[1.25], grads=[{"w": g}], params=[{"w": w0}, {"w": w0 - g}])


def test_a_record_crosses_and_is_rebuilt_exactly():
    rebuilt = need_record(3, plain.roundtrip(plain_record(_record())), "rank 0")
    assert isinstance(rebuilt, Record) and rebuilt.losses == [1.25]
    assert torch.equal(rebuilt.grads[0]["w"], _record().grads[0]["w"])
    assert [set(p) for p in rebuilt.params] == [{"w"}, {"w"}]
    assert compare(_record(), rebuilt).ok.all()


def _broken(**change) -> dict:
    data = plain.roundtrip(plain_record(_record()))
    data.update(change)
    return data


@pytest.mark.parametrize(
    "value",
    [
        None,
        [],
        _broken(losses=[True]),
        _broken(losses=["1.0"]),
        _broken(losses=1.0),
        _broken(grads=[]),  # one step, no gradients
        _broken(params=[{"w": torch.ones(2)}]),  # the parameters before training missing
        _broken(grads=[{1: torch.ones(2)}]),  # a name that is not a str
        _broken(grads=[{"w": [1.0, 2.0]}]),  # not a tensor
    ],
)
def test_a_malformed_record_is_a_verdict(value):
    with pytest.raises(AssertionError, match=r"^✗ task 3: rank 0: the run handed back no record"):
        need_record(3, value, "rank 0")


def test_the_verdict_says_which_steps():
    with pytest.raises(AssertionError, match=r"no record of its training steps$"):
        need_record(3, None, "rank 0", steps="its training steps")
    with pytest.raises(AssertionError, match=r"no record of its steps$"):
        need_record(3, None, "rank 0")


def test_named_tensors():
    assert named_tensors([{"a": torch.ones(1)}, {}], 2)
    assert not named_tensors([{"a": torch.ones(1)}], 2)
    assert not named_tensors([{"a": 1.0}], 1) and not named_tensors(({"a": torch.ones(1)},), 1)


def test_first_mismatch_names_the_first_row_that_fails():
    assert first_mismatch(1, compare(_record(), [_record(), _record()]), "2 ranks") is None
    table = compare(_record(), [_record(), _record(shift=1.0)])
    with pytest.raises(AssertionError) as info:
        first_mismatch(1, table, "2 ranks", "; a hint")
    line = str(info.value)
    assert line.startswith("✗ task 1: on 2 ranks, step 1, rank 1: grad 'w' differs from one ")
    assert line.endswith("; a hint") and "process on the full batch (" in line
